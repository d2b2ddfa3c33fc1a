"""Packages for setuptools (the rest of the metadata is in pyproject.toml).

The shaders live in the repository's top-level shaders/ and ship inside the package as
`kvviz.shaders` (kvviz.gpu.shaders loads them through importlib.resources), so an installed wheel
runs every kernel.
"""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["kvviz", "kvviz.*"]) + ["kvviz.shaders"],
    package_dir={"kvviz.shaders": "shaders"},
    package_data={"kvviz.shaders": ["*/*.wgsl", "*/*.comp", "*/*.wgsl.j2"]},
)
