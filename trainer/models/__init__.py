"""Model architectures and sources, without torch: exact parameter counts from config.json, shipped
architectures, local folders and hub ids checked cheaply."""
