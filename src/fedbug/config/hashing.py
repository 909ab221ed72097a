"""The config hash that names a run folder and lets a run resume: everything that changes the
numbers, with the keys and options added since run folders existed hashed as they were then."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from fedbug.algorithms import ALGORITHMS
from fedbug.config.schema import BaseConfig
from fedbug.policies import POLICIES
from fedbug.selection import SELECTIONS

_REGISTRIES = (ALGORITHMS, POLICIES, SELECTIONS)

_LATER_KEYS = (
    "on_divergence",
    "min_results",
    "memory_format",
    "dataset_options",
    "task",
    "precision",
    "dp",
    "dp_sgd",
    "hf_config",
    "adapters",
    "targets",
)
_NOT_HASHED = {
    "on_short_round",  # a run either stops or skips rounds it records; resumable either way
    "grid",
    "seeds",
    "name",
    "count_flops",
    "threads",
    "executor",
    "cohort",
    "workers",
    "flower",
    "tracking",
    "tracking_uri",
    "device",
    "device_data_share",
    "deterministic",
    "record_updates",  # what a run writes for the attack, not its numbers
}


#: flower.secagg's options that change the numbers: SecAgg+'s quantisation (its masks do not)
_SECAGG_HASHED = ("clipping_range", "quantization_range", "max_weight", "residual")


def config_hash(cfg: BaseConfig) -> str:
    """A short hash of everything that changes the numbers (not sweep bookkeeping)."""
    # threads is left out so a run resumes on a machine with another core count (its numbers
    # then agree within float32 rounding, not bitwise); it is recorded in config.yaml. Where
    # clients run (executor and its settings) does not change the numbers.
    d = hashed_view(cfg.model_dump(mode="json"))
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def is_hashed(key: str) -> bool:
    """Whether a config key (dotted for an options block's: ``bottom_up.gu_ratio``) counts in
    the config hash where it is set (``record_updates``, ``threads``, ``executor``... do not)."""
    return key.split(".")[0] not in _NOT_HASHED


def hashed_view(config: dict[str, Any]) -> dict[str, Any]:
    """A config as dumped to JSON (``cfg.model_dump(mode="json")``, a summary's ``config``) as
    the config hash sees it: without the keys it leaves out, flower.secagg's quantisation as
    ``secagg``, later keys and options only where set, and policy options where they were.
    Runs whose views differ only in ``seed`` are one config (``fedbug report`` groups them)."""
    d = copy.deepcopy({k: v for k, v in config.items() if k not in _NOT_HASHED})
    flower = config.get("flower")
    secagg = flower.get("secagg") if isinstance(flower, dict) else None
    if isinstance(secagg, dict):
        d["secagg"] = {k: secagg.get(k) for k in _SECAGG_HASHED}
    # keys added after run folders existed count only when set, so older folders still resume
    for key in _LATER_KEYS:
        if d.get(key) == BaseConfig.model_fields[key].get_default(call_default_factory=True):
            d.pop(key, None)
    _later_options_when_set(d)
    _policy_options_as_before(d, d.get("policy"))
    return d


#: Policy options that were top-level keys before policies owned their blocks, with the value
#: they had when unset; hashed where they were, so run folders from then still resume.
_FORMER_POLICY_KEYS = {"gu_ratio": 0.0, "fixed_units": 1}
#: The options blocks every hash held, chosen or not; a block added since counts only when its
#: method is chosen (and a former top-level key goes back to the top level).
_ALWAYS_HASHED_BLOCKS = {
    "fedprox",
    "feddyn",
    "fedexp",
    "feddecorr",
    "fedrep",
    "fjord",
    "freezefl",
    "reputation",
    "rbcsf",
}


#: Options added to a method's block after run folders existed: hashed only when they differ
#: from their default, so folders from before still resume.
_LATER_OPTIONS = {"feddyn": ("clip",), "bottom_up": ("gu_period",), "top_down": ("gu_period",)}


def _later_options_when_set(d: dict[str, Any]) -> None:
    for name, keys in _LATER_OPTIONS.items():
        block = d.get(name)
        params = next((r.get(name).params_cls for r in _REGISTRIES if name in r), None)
        if not isinstance(block, dict) or params is None:
            continue
        fields = params.model_fields
        for key in keys:
            if key in block and block[key] == fields[key].get_default(call_default_factory=True):
                del block[key]


def _policy_options_as_before(d: dict[str, Any], policy: str | None) -> None:
    """Options blocks in ``d`` hashed as they were before policies owned their blocks: the
    chosen policy's former top-level keys at the top level (their former defaults otherwise),
    blocks added since only when their method is chosen."""
    former = dict(_FORMER_POLICY_KEYS)
    chosen = {d.get("algorithm"), policy, d.get("selection")}
    for registry in _REGISTRIES:
        for name, cls in registry.items():
            if cls.params_cls is None or name in _ALWAYS_HASHED_BLOCKS:
                continue
            block = d.pop(name, None)
            if name not in chosen or block is None:
                continue
            for key, value in block.items():
                if key in former and registry is POLICIES:
                    former[key] = value
                else:
                    d.setdefault(name, {})[key] = value
    d.update(former)
