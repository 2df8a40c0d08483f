"""Packaging beyond pyproject.toml: the top-level configs/ ship inside the package.

The YAML configs live in configs/ at the top of the checkout, where people look for them. The wheel
carries them as package data in annotated_transformer/configs/, where `config_loading.shipped_config_dir`
finds them in an installed package. Package data cannot lie outside its package's folder, so a
package directory mapping brings the folder in; pyproject.toml can map it, but then needs every
package listed by hand, and a new subpackage left off that list would be missing from the wheel.
Here discovery stays automatic. (No symlink: Windows checkouts and some archives break them.)
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["annotated_transformer", "annotated_transformer.*"]),
              "annotated_transformer.configs"],
    package_dir={"annotated_transformer.configs": "configs"},
    package_data={"annotated_transformer.configs": ["*.yaml"]},
)
