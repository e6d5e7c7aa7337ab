"""run() options are checked at once: a ConfigError (a ValueError too) naming the option."""

from __future__ import annotations

import math

import pytest

from abs_engine.errors import ConfigError
from abs_engine.executors.config import JobConfig

BAD = [
    ("checkpoint_timeout", -1), ("checkpoint_timeout", 0), ("checkpoint_timeout", math.inf),
    ("checkpoint_interval", math.inf), ("checkpoint_interval", math.nan), ("checkpoint_interval", -0.5),
    ("restart_delay", math.inf), ("restart_delay", -1), ("startup_timeout", math.inf),
    ("heartbeat_interval", 0), ("task_timeout", math.inf), ("task_timeout", -1), ("aligned_timeout", math.inf),
    ("restart_attempts", 1.5), ("restart_attempts", -1), ("max_concurrent_checkpoints", 0),
    ("retained_checkpoints", True), ("tolerable_failed_checkpoints", -1), ("resume", "yes"),
    ("loop_memory", 1000), ("loop_disk", -1), ("dashboard_token", "short"), ("dashboard_token", "x" * 20 + "/"),
    ("checkpoint_dir", ""), ("checkpoint_dir", "ck\x00pt"), ("progress", "no"), ("tls", 1),
    ("heartbeat_timeout", -1), ("heartbeat_timeout", math.inf), ("heartbeat_timeout", 3.0),
]


@pytest.mark.parametrize("option,value", BAD)
def test_a_bad_option_is_a_config_error_naming_it(option: str, value: object) -> None:
    with pytest.raises(ConfigError) as e:
        JobConfig(**{option: value})  # type: ignore[arg-type]
    assert e.value.option == option and option in str(e.value)
    assert isinstance(e.value, ValueError)


def test_heartbeat_timeout_must_span_heartbeats() -> None:
    """The worker gives up after half the timeout: that half must hold two heartbeats."""
    with pytest.raises(ConfigError, match="at least four times heartbeat_interval"):
        JobConfig(heartbeat_interval=2.0, heartbeat_timeout=7.0)
    assert JobConfig(heartbeat_interval=2.0, heartbeat_timeout=8.0).heartbeat_timeout == 8.0
    assert JobConfig(heartbeat_interval=60.0, heartbeat_timeout=0).heartbeat_timeout == 0


def test_the_heartbeat_bound_holds_workers_that_may_be_elsewhere_only():
    """Spark's workers may run on other machines; local ones share the driver's (there
    task_timeout bounds a silent worker). The default spans four heartbeats at least."""
    assert JobConfig(executor="spark").heartbeat_bound() == 30.0
    assert JobConfig(executor="spark", heartbeat_interval=10.0).heartbeat_bound() == 40.0  # no ConfigError
    assert JobConfig(executor="spark", heartbeat_timeout=6.0).heartbeat_bound() == 6.0
    assert JobConfig(executor="spark", heartbeat_timeout=0).heartbeat_bound() == 0.0
    assert JobConfig(executor="local", heartbeat_timeout=6.0).heartbeat_bound() == 0.0
    assert JobConfig(executor="inprocess").heartbeat_bound() == 0.0


@pytest.mark.parametrize("option,value", [("checkpoint_interval", 0.01), ("task_timeout", 0), ("resume", "if-present"),
                                          ("resume", True), ("loop_memory", None), ("restart_delay", 0)])
def test_good_options_pass(option: str, value: object) -> None:
    assert getattr(JobConfig(**{option: value}), option) == value  # type: ignore[arg-type]
