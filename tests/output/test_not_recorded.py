"""What a queue system does not record is named, never made up (issue 39): each preset's
`not_recorded` reaches check-config, the log's inventory, the status page and docs/presets.md,
and a signal named there is one of the catalog's (exporter.output.catalog.SIGNALS). Whether each
system really serves every other signal is proven by the conformance harness
(tests/conformance: `unnamed_signals`)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from exporter.config import presets
from exporter.config import settings as config_module
from exporter.config.settings import ConfigError
from exporter.output.catalog import SIGNAL_WHAT
from tests.commands.test_check_config import run_cli
from tests.conftest import wait_for


@pytest.mark.fast
def test_every_preset_names_only_catalog_signals_and_says_why():
    for name in presets.available():
        config = config_module.from_dict({"presets": [name]})
        for system, signals in config.not_recorded.items():
            assert system == name, f"{name}: names what {system} does not record"
            for signal, why in signals.items():
                assert signal in SIGNAL_WHAT and len(why) > 20, (name, signal, why)


@pytest.mark.fast
def test_an_unknown_signal_is_refused_with_its_place():
    raw = {"not_recorded": {"custom": {"wrokers": "no heartbeat"}}}
    with pytest.raises(ConfigError) as error:
        config_module.from_dict(raw)
    assert "not_recorded" in str(error.value)
    assert "unknown signal 'wrokers' (did you mean 'workers'?" in str(error.value)


@pytest.mark.fast
def test_check_config_names_what_the_system_does_not_record(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("presets: [dramatiq]\nsources: {redis: {url: 'redis://127.0.0.1:1/0'}}\n")
    result = run_cli("check-config", str(path))
    assert result.returncode == 0, result.stderr
    expected = config_module.from_dict({"presets": ["dramatiq"]}).not_recorded["dramatiq"]
    for signal, why in expected.items():
        assert f"# not recorded by dramatiq {signal}: {why}" in result.stdout


def test_the_status_page_lists_what_the_system_does_not_record(redis_url, run_exporter):
    app = run_exporter(redis_url=redis_url, preset=["huey"])
    url = f"http://127.0.0.1:{app.server.port}"

    def document():
        with urllib.request.urlopen(f"{url}/status.json", timeout=10) as response:
            return json.loads(response.read())

    named = wait_for(lambda: document()["not_recorded"])
    expected = app.config.not_recorded["huey"]
    assert {(entry["signal"], entry["why"]) for entry in named} == set(expected.items())
    table = next(t for t in document()["view"]["tables"] if t["id"] == "not-recorded")
    assert ["huey", "running", SIGNAL_WHAT["running"], expected["running"]] in table["rows"]
    with urllib.request.urlopen(url + "/", timeout=10) as response:
        page = response.read().decode()
    assert "Signals the systems do not record" in page and "huey_consumer writes no" in page
