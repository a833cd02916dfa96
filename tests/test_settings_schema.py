"""Every setting is checked before any model loads, by its declaration (stages/schema.py).

The sweep feeds every numeric key of conf/ 0, a negative, NaN and (for an integer) a float,
and every list key [], and expects a refusal naming the key unless the declaration admits
the value; a key of conf/ that nothing declares fails it. The tests of the test show the
sweep catching a key whose check is dropped and a key nobody declared.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from omegaconf import OmegaConf, open_dict

from sprinter_train import __main__ as entry
from sprinter_train.core.config import CONF_DIR, compose_config
from sprinter_train.core.schema import Num, Seq, leaves, spec_of, unknown
from sprinter_train.core.validation import ConfigError
from sprinter_train.stages import schema as declarations
from sprinter_train.stages import settings
from sprinter_train.stages.settings import config_problems, resolved

VARIANTS = [(), ("models=tiny_random", "data=lm1b", "distill=companion")]  # each group's keys
NAN = float("nan")


def _set(tree: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(tree)
    *path, last = key.split(".")
    node = out
    for name in path:
        node = node[name]
    node[last] = value
    return out


def _probes(spec: Num | Seq) -> list[Any]:
    """0, a negative, NaN and a float where an integer is meant; [] for a list."""
    if isinstance(spec, Seq):
        return [[]]
    return [0, -1, NAN, *([1000.0] if spec.whole else [])]


def _names(problems: list[str], key: str) -> bool:
    return any(line.startswith((f"{key}=", f"{key}[", f"{key} ")) for line in problems)


def sweep(
    tree: dict[str, Any],
    problems_of: Callable[[dict[str, Any]], list[str]],
    only: tuple[str, ...] | None = None,
) -> list[str]:
    """Each probe whose verdict is not its declaration's (a refusal naming the key where the
    declaration refuses the value, none where it admits it), and each undeclared key (`only`:
    probe these keys alone)."""
    full = declarations.schema()
    known = partial(settings.method_parameter, tree)
    failures = [
        f"declared nowhere: {line}" for line in unknown(tree, full, declarations.FREE, known)
    ]
    for key, _ in leaves(tree):
        if only is not None and key not in only:
            continue
        spec = spec_of(full, key)
        if not isinstance(spec, Num | Seq):
            continue
        for probe in _probes(spec):
            refused = _names(problems_of(_set(tree, key, probe)), key)
            admitted = not spec.problems(key, probe)
            if refused == admitted:
                failures.append(f"{key}={probe!r}: {'refused' if refused else 'admitted'}")
    return failures


@pytest.fixture(scope="module")
def trees() -> list[dict[str, Any]]:
    return [resolved(compose_config("stage=all", *variant)) for variant in VARIANTS]


def test_the_shipped_configs_pass_their_declarations(trees) -> None:
    for tree in trees:
        assert config_problems(tree) == []


@pytest.mark.heavy  # hundreds of configs checked: make test, not test-quick
def test_every_numeric_and_list_key_is_swept_and_refused_as_declared(trees) -> None:
    failures = [line for tree in trees for line in sweep(tree, config_problems)]
    assert failures == []


def test_nan_a_float_integer_and_an_empty_list_are_never_admitted_silently() -> None:
    """What a declaration can admit is said in it: NaN never, a float never for an integer,
    [] only with `empty`, 0 or a negative only where a bound or a note says so."""
    for key, spec in declarations.schema().items():
        if isinstance(spec, Num):
            assert not spec.accepts(NAN) and not spec.accepts(math.inf), key
            if spec.whole:
                assert not spec.accepts(1000.0) and not spec.accepts(True), key
            if spec.accepts(0) or spec.accepts(-1):
                assert spec.low is not None or spec.note, f"{key}: say why 0 or -1 is valid"
        if isinstance(spec, Seq) and spec.empty:
            assert spec.note, f"{key}: say what [] means"


def test_the_sweep_catches_a_key_whose_check_is_dropped(trees, monkeypatch) -> None:
    """Test of the test: bench.latency.reps with its declaration's check dropped (still a
    known key, so not refused as unknown; the sweep still expects it) is admitted at 0, and
    the sweep says so."""

    class Unchecked:
        def problems(self, key: str, value: Any) -> list[str]:
            return []

    reduced = {**declarations.schema(), "bench.latency.reps": Unchecked()}
    monkeypatch.setattr(settings, "schema", lambda: reduced)
    keys = ("bench.latency.reps", "bench.latency.context_tokens")
    assert sweep(trees[0], config_problems, keys) == [
        "bench.latency.reps=0: admitted",
        "bench.latency.reps=-1: admitted",
        "bench.latency.reps=nan: admitted",
        "bench.latency.reps=1000.0: admitted",
    ]


def test_the_sweep_catches_a_key_nobody_declared(trees) -> None:
    """Test of the test: a new key of conf/ without a declaration fails the sweep."""
    tree = _set(trees[0], "bench.new_knob", 3)
    (failure,) = sweep(tree, config_problems, ())
    assert failure.startswith("declared nowhere: bench.new_knob is not a setting")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("bench.max_new_tokens=1e3", "bench.max_new_tokens"),  # item 7
        ("bench.methods=[]", "bench.methods"),  # item 8
        ("bench.latency.reps=0", "bench.latency.reps"),  # item 9
        ("train.feature_settings.accept_n0=-4", "train.feature_settings.accept_n0"),  # item 10
        ("train.feature_settings.run_position_cap=-1", "train.feature_settings.run_position_cap"),
        ("harvest.continuation_tokens=nan", "harvest.continuation_tokens"),
    ],
)
def test_the_entry_point_refuses_before_any_model_loads(
    compose_cfg, monkeypatch, override, key
) -> None:
    """Issue 39 items 7-10: each passed validation and failed after the models had loaded
    (TypeError, ZeroDivisionError, StatisticsError, sklearn's NaN). The stage module is
    never imported: any work would fail the test."""

    stages, imported = set(entry.STAGES.values()), entry.importlib.import_module

    def no_work(name: str, *args: Any) -> Any:
        if name in stages:
            raise AssertionError(f"{name} was imported: work began")
        return imported(name, *args)

    stage = "train" if key.startswith("train.") else "bench"
    cfg = compose_cfg(f"stage={stage}", "models=tiny_random", override)
    monkeypatch.setattr(entry.importlib, "import_module", no_work)
    with pytest.raises(ConfigError) as error:
        entry.run_stage(cfg)
    assert key in str(error.value) and "nothing was run" in str(error.value)


def test_a_declared_integer_refuses_a_whole_float_the_config_parses() -> None:
    """1e3 reaches the config as 1000.0: refused, not rounded, so no slice meets a float."""
    cfg = compose_config("stage=bench", "bench.max_new_tokens=1e3")
    assert OmegaConf.to_container(cfg)["bench"]["max_new_tokens"] == 1000.0
    assert any(line.startswith("bench.max_new_tokens=1000.0") for line in config_problems(cfg))


SWITCHES = (
    "train.select.enabled",
    "bench.allow_train_overlap",
    "evaluate.allow_train_overlap",
    "bench.latency.reuse",
    "harvest.verify_hashes",
)


@pytest.mark.parametrize("key", SWITCHES)
def test_a_switch_reads_every_word_for_true_and_false_as_it_means(key) -> None:
    """Trust round 4, item 1: `train.select.enabled=no` trained with selection on (`bool('no')`
    is True). Every form Hydra and YAML mean is read as such; anything else is refused."""
    for words, meant in (("no off 0 false False NO", False), ("yes on 1 true True", True)):
        for word in words.split():
            cfg = compose_config("stage=train", f"{key}={word}")
            assert config_problems(cfg) == [], (key, word)
            assert OmegaConf.select(settings.settle(cfg), key) is meant, (key, word)
    (line,) = config_problems(compose_config("stage=train", f"{key}=maybe"))
    assert line.startswith(f"{key}='maybe'") and "true or false" in line


def _dispatch(monkeypatch, compose_cfg, *overrides: str) -> Any:
    """Run the entry point on these overrides with the stage module replaced by one that
    records the config it is given (nothing loads)."""
    seen: dict[str, Any] = {}
    stages, imported = set(entry.STAGES.values()), entry.importlib.import_module

    def fake(name: str, *args: Any) -> Any:
        if name in stages:
            return type("Stage", (), {"run": staticmethod(lambda cfg: seen.update(cfg=cfg))})
        return imported(name, *args)

    monkeypatch.setattr(entry.importlib, "import_module", fake)
    entry.run_stage(compose_cfg("stage=train", "models=tiny_random", *overrides))
    return seen["cfg"]


def test_the_stage_sees_no_as_false(compose_cfg, monkeypatch) -> None:
    """`stage=train train.select.enabled=no` trains exactly as `=false` does: the stage is
    handed False, not the word."""
    cfg = _dispatch(
        monkeypatch, compose_cfg, "train.select.enabled=no", "harvest.verify_hashes=off"
    )
    assert cfg.train.select.enabled is False and cfg.harvest.verify_hashes is False
    assert (
        _dispatch(monkeypatch, compose_cfg, "train.select.enabled=1").train.select.enabled is True
    )


@pytest.mark.parametrize(
    ("override", "named", "hint"),
    [
        ("++train.bogus_key=1", "train.bogus_key", ""),
        ("++methods.sd_learned.verifier.haed=mlp", "methods.sd_learned.verifier.haed", "head"),
        ("++bench.max_new_token=8", "bench.max_new_token", "bench.max_new_tokens"),
        ("+decoding.compile_cahce=auto", "decoding.compile_cahce", "decoding.compile_cache"),
    ],
)
def test_a_key_added_with_plus_is_refused_naming_it_before_any_work(
    compose_cfg, monkeypatch, override, named, hint
) -> None:
    """Trust round 4, item 9: `++methods.sd_learned.verifier.haed=mlp` was ignored without a
    word. A key declared nowhere is refused before the stage module is imported, with the
    closest known key."""

    stages, imported = set(entry.STAGES.values()), entry.importlib.import_module

    def no_work(name: str, *args: Any) -> Any:
        if name in stages:
            raise AssertionError(f"{name} was imported: work began")
        return imported(name, *args)

    cfg = compose_cfg("stage=bench", "models=tiny_random", override)
    monkeypatch.setattr(entry.importlib, "import_module", no_work)
    with pytest.raises(ConfigError) as error:
        entry.run_stage(cfg)
    assert f"{named} is not a setting" in str(error.value) and hint in str(error.value)


def test_the_documented_plus_plus_keys_are_known() -> None:
    """What the docs tell users to add with `++` (a method's verifier head, the online
    verifier) is declared, so it passes."""
    cfg = compose_config(
        "stage=bench",
        "++methods.sd_learned.verifier.head=mlp",
        "++methods.sprinter.verifier={kind: online, warmup_score: 0.0, positions: 1}",
        "methods.sd_learned.table={binning: null, optional: true}",
        "++models.draft.revision=main",
        "++models.draft.trust_remote_code=no",
    )
    assert config_problems(cfg) == []


@pytest.mark.parametrize(
    "override",
    [
        "bench.max_new_tokens=1000000000",
        "bench.num_prompts=100000000",
        "decoding.static_capacity=1000000000",
    ],
)
def test_a_count_that_would_run_for_days_or_exhaust_memory_is_refused(override) -> None:
    key = override.split("=")[0]
    (line,) = config_problems(compose_config("stage=bench", override))
    assert line.startswith(f"{key}=") and "<=" in line


@pytest.mark.heavy  # hundreds of configs checked: make test, not test-quick
def test_every_key_of_every_config_option_is_declared() -> None:
    """Each option of each config group composes to keys the schema declares (of any type:
    a word or a path too), so no shipped key is refused as unknown."""
    options = [
        f"{group.name}={path.stem}"
        for group in sorted(CONF_DIR.iterdir())
        if group.is_dir() and group.name != "methods"
        for path in sorted(group.glob("*.yaml"))
    ]
    found = {option: config_problems(compose_config("stage=all", option)) for option in options}
    assert {option: lines for option, lines in found.items() if lines} == {}


@dataclass
class Knob:
    """A stand-in method class: its signature is what declares its config node's keys."""

    power: float = 1.0


def test_a_new_methods_own_parameters_are_declared_by_its_class() -> None:
    """A method is one class and one config node: the node's keys are its class's parameters
    (instantiate passes them), so they need no line in stages/schema.py, and a key the class
    does not take is refused as any unknown key is."""
    cfg = compose_config("stage=train")
    with open_dict(cfg):
        cfg.methods.knob = {"_target_": f"{__name__}.Knob", "power": 2.0}
    assert config_problems(cfg) == []
    with open_dict(cfg):
        cfg.methods.knob.powr = 2.0
    (line,) = config_problems(cfg)
    assert line.startswith("methods.knob.powr is not a setting")
