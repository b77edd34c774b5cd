"""The one error type of loadax_mesh."""


class MeshConfigError(ValueError):
    """Bad input: the message names the field, the value given and what is accepted."""
