"""``--watch-timeout`` / ``ManagerOptions.watch_timeout_seconds``: how long each informer's
watch lasts ([N, 2N) s, client-go's rule) and so how soon a silent watch is presumed dead."""

from __future__ import annotations

import ssl

import pytest

from controller_runtime.manager import Manager, ManagerOptions
from controllers.app import build_manager
from controllers.cli import settings_from
from informers.reflector_machine import ReflectorMachine
from kubeclient.config import ClusterConfig

CONFIG = ClusterConfig("https://127.0.0.1:1", ssl.create_default_context())


async def test_the_default_is_client_gos_five_to_ten_minutes() -> None:
    manager = build_manager(settings_from([]), CONFIG)
    options = manager.factory.options
    assert options is not None
    assert (options.watch_timeout_min, options.watch_timeout_max) == (300, 600)


async def test_the_flag_reaches_every_informer_and_bounds_the_idle_window() -> None:
    manager = build_manager(settings_from(["--watch-timeout", "5"]), CONFIG)
    options = manager.factory.options
    assert options is not None
    assert (options.watch_timeout_min, options.watch_timeout_max) == (5, 10)
    machine = ReflectorMachine(options=options)
    # The idle window of the first watch: its timeoutSeconds (5..9) plus the 10 s margin.
    assert machine.idle_timeout_seconds <= 2 * 5 + options.idle_margin


async def test_a_watch_timeout_below_one_second_is_refused() -> None:
    with pytest.raises(ValueError, match="watch_timeout_seconds"):
        Manager(CONFIG, ManagerOptions(watch_timeout_seconds=0))
    with pytest.raises(SystemExit):
        settings_from(["--watch-timeout", "0"])
