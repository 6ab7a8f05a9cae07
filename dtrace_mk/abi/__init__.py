"""Hook ABI v1 (see definition.py, the one source of truth) and the task schema."""
from .definition import *  # noqa: F401,F403
from .definition import ABI_VERSION, CONTEXT_FIELDS, CONTEXT_SIZE, HOOKS, HELPERS, MAP_TYPES  # noqa: F401
