"""Provisioning: turn ``provisioning_parameters.json`` into a configured node.

``models`` validates the parameters, ``plan`` (pure) decides what the node should look
like, ``steps`` compares and changes one thing each, ``apply`` runs a plan idempotently.
"""
