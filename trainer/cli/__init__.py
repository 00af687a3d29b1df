"""``trainpilot-cli``: thin commands over the rooms below."""
