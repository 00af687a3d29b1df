"""Training data before tokenization (light): reading files into records, formats, the demo sample."""
