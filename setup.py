"""Packages for setuptools (the rest of the metadata is in pyproject.toml).

The shaders live in the repository's top-level shaders/ and ship inside the package as
`kvviz.shaders` (kvviz.gpu.shaders loads them through importlib.resources), so an installed wheel
runs every kernel. Each family's folder (shaders/int8, shaders/attention, ...) holds only shader
files, yet Python can import it as a namespace package: it is listed as the package
`kvviz.shaders.<family>` with its files as that package's data, which is what setuptools expects of
such a folder (left out of `packages`, each one costs a "Package would be ignored" warning per build).
"""
from setuptools import find_namespace_packages, find_packages, setup

SHADER_FILES = ["*.wgsl", "*.comp", "*.wgsl.j2"]
SHADER_FAMILIES = [f"kvviz.shaders.{p}" for p in find_namespace_packages(where="shaders", exclude=["*__pycache__*"])]

setup(
    packages=find_packages(include=["kvviz", "kvviz.*"]) + ["kvviz.shaders"] + SHADER_FAMILIES,
    package_dir={"kvviz.shaders": "shaders"},
    package_data={p: SHADER_FILES for p in ["kvviz.shaders"] + SHADER_FAMILIES},
)
