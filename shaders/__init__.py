"""The shader sources, shipped as package data (kvviz.shaders); see kvviz/gpu/shaders.py."""
