"""Packaging beyond what pyproject.toml can say: the top-level ``configs/`` folder (the presets and the demo
config a user copies and edits) goes into the wheel as the ``trainer.configs`` package data, where
``trainer.core.paths.CONFIGS_DIR`` finds it in an installed TrainPilot. Everything else is in pyproject.toml."""
from setuptools import find_namespace_packages, setup

setup(
    # as pyproject's packages.find did (namespaces included: the data-only folders such as trainer/resources)
    packages=[*find_namespace_packages(include=["app*", "trainer*"]), "trainer.configs", "trainer.configs.presets"],
    package_dir={"trainer.configs": "configs"},
)
