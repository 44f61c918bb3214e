"""The one exception family draftcore raises.

Every message names the argument, the value received and what was expected, so a user can fix the
call without reading draftcore's source.
"""


class DraftcoreError(Exception):
    """Base class of every error draftcore raises on purpose."""


class ConfigError(DraftcoreError, ValueError):
    """A constructor or option got a value outside its allowed range."""


class InputError(DraftcoreError, ValueError):
    """A call got data of the wrong type, dtype, shape or range (prompt, tree, saved file)."""


class BusyError(DraftcoreError, RuntimeError):
    """An object that serves one request at a time is serving another (a verifier, a single-request
    drafter), or a shared one has no room for another (a TrieDrafter's max_requests)."""


class BackendError(DraftcoreError, RuntimeError):
    """A verifier (backend) misbehaved: wrong output shape, a model that ignores the tree mask, ..."""


def describe(value) -> str:
    """A short, safe rendering of a value for an error message."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"array(shape={tuple(shape)}, dtype={dtype})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
