"""How workers are started: command lines, the DeepSpeed config, exported scripts. Light."""
