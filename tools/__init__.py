"""Developer tools (not shipped in the wheel): screenshot scripts for the docs."""
