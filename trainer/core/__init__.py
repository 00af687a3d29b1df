"""The floor every room stands on: exit codes and user errors, secrets, units, paths, dotted keys.
Standard library (and keyring, lazily) only."""
