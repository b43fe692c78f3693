"""The model layer: what serves a user's model around the technique, built on `pieceworks.core`'s public
names as any engine would.

`compile(model, config)` returns a `CompiledModel` (compiled_model.py): called as the model is, it traces the
model once, compiles its pieces (`compile_pieces`) and serves every batch through a `Runtime`. Around that:
the call's arguments (arguments.py: their order and checks), their binding to the stitching module's inputs
(binding.py), the state watch that sees the model change (watch.py) and the serving record that lets a warm
start skip the trace (record.py).
"""

from .arguments import InputError, batch_of
from .compiled_model import CompiledModel, compile
from .watch import GlobalHookError, StateReplacedError

__all__ = ["CompiledModel", "GlobalHookError", "InputError", "StateReplacedError", "batch_of", "compile"]
