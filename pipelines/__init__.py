"""Example pipelines that use the elastic-step components; their YAML sits beside them."""
