"""The model's forward pass on the GPU (wgpu): kernels and their numpy oracles, the device weights of a model, a
runner with the numpy runner's interface, and the choice between the two (kvviz/forward/select.py)."""
