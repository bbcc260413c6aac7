"""The JSON Schema of provisioning_parameters.json, generated from the models.

The committed copy, ``lifecycle_scripts/provisioning_parameters.schema.json``, lets
editors check a parameters file; a unit test keeps it equal to this output.
"""

from __future__ import annotations

import json

from hyperpod_agent.provision.models import ProvisioningParameters

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_text() -> str:
    """The schema as stable, sorted, indented JSON ending in a newline."""
    schema = ProvisioningParameters.model_json_schema(by_alias=True)
    schema["$schema"] = SCHEMA_DIALECT
    schema["title"] = "provisioning_parameters.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
