"""Type stub for cadeloop's native module."""

__version__: str
PY_VERSION_BUILT: str

def own_gil_supported() -> bool: ...
def in_main_interpreter() -> bool: ...
