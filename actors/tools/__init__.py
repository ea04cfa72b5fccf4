"""Tools: Python and bash (argc) tools, toolboxes, MCP servers, Loki's environment."""
