"""Real models' attention configurations (:mod:`.registry` the types, :mod:`.load` the loader, data in
``data/*.toml``) and the ``models`` suite built from them (:mod:`.suite`)."""

from conformance.models.load import builtin_registry, load_registry
from conformance.models.registry import MLA, ModelConfig, Registry, RegistryError, TPShard
from conformance.models.suite import ModelRef, case_model, model_cases, select_model_cases

__all__ = [
    "MLA",
    "ModelConfig",
    "ModelRef",
    "Registry",
    "RegistryError",
    "TPShard",
    "builtin_registry",
    "case_model",
    "load_registry",
    "model_cases",
    "select_model_cases",
]
