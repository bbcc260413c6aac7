"""Provisioning: turn ``provisioning_parameters.json`` into a configured node.

``load`` reads and validates the parameters (``models``), ``plan`` (pure) decides what
the node should look like from files ``render`` writes, ``steps`` and ``commands``
compare and change one thing each, ``apply`` runs a plan idempotently.
"""
