"""GGUF metadata as Python values, with errors that name the key and the file."""
from __future__ import annotations

from pathlib import Path

from gguf import GGUFValueType

from kvviz.errors import InvalidInput


def field_value(f):
    """Decode a GGUFReader field without relying on ReaderField.contents() (absent in older gguf)."""
    if not f.types:
        return None
    main = f.types[0]
    if main == GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        return [v for i in f.data for v in f.parts[i].tolist()]
    if main == GGUFValueType.STRING:
        return bytes(f.parts[-1]).decode("utf-8", errors="replace")
    return f.parts[-1].tolist()[0]


class Meta:
    """The metadata of one GGUF file; `arch` keys are read with the architecture's prefix."""

    def __init__(self, reader, path: Path):
        self._fields = reader.fields
        self.path = Path(path)
        self.arch = str(self.get("general.architecture", ""))

    def has(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default=None):
        f = self._fields.get(key)
        return default if f is None else field_value(f)

    def require(self, key: str):
        if key not in self._fields:
            raise InvalidInput(
                f"{self.path.name}: GGUF metadata key '{key}' is missing",
                "The file is not a complete llama.cpp GGUF model; re-convert it with convert_hf_to_gguf.py.",
            )
        return field_value(self._fields[key])

    # keys under the architecture's prefix ("qwen2.block_count")
    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def a_has(self, name: str) -> bool:
        return self.has(self.key(name))

    def a_get(self, name: str, default=None):
        return self.get(self.key(name), default)

    def a_require(self, name: str):
        return self.require(self.key(name))

    def positive(self, name: str, value: int) -> int:
        """`value` of arch key `name`, refused unless positive (a head count of 0 would divide by zero)."""
        if value <= 0:
            raise InvalidInput(f"{self.path.name}: GGUF metadata '{self.key(name)}' = {value}, expected a positive "
                               "number", "The file's metadata is corrupt or was not written by llama.cpp's converter.")
        return value

    def uniform(self, name: str, v) -> int:
        """A per-layer value the runner needs equal on every layer (some GGUFs store per-layer arrays)."""
        if isinstance(v, list):
            if not v or len(set(v)) != 1:
                raise InvalidInput(f"{self.path.name}: per-layer '{self.key(name)}' varies ({v[:8]}...)",
                                   "Models with non-uniform layers are not supported.")
            v = v[0]
        return int(v)
