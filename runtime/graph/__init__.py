"""graph.yaml: its Structs, loader, schema, validation, templates and configuration."""
