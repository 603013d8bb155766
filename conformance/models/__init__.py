"""Real models' attention configurations as data: :mod:`.registry` the types, :mod:`.load` the loader, data in
``data/*.toml``.  Below the case model (the case space reads its head counts here); the ``models`` suite built
from them is :mod:`conformance.suites.models`."""

from conformance.models.load import builtin_registry, load_registry
from conformance.models.registry import MLA, ModelConfig, Registry, RegistryError, TPShard

__all__ = [
    "MLA",
    "ModelConfig",
    "Registry",
    "RegistryError",
    "TPShard",
    "builtin_registry",
    "load_registry",
]
