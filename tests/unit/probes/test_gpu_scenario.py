"""The fake backend's scenario format: parsing, defaults, events, reloads."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.probes._fake_nvml import FakeBackend, parse_scenario, scenario_gpus


def write(path: Path, data: dict[str, Any] | str) -> None:
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    os.utime(path, ns=(before + 10**9, before + 10**9))


def test_generate_gives_healthy_defaults() -> None:
    gpus = scenario_gpus(parse_scenario('{"generate": 2}'))
    assert [g.index for g in gpus] == [0, 1]
    g = gpus[1]
    assert (g.uuid, g.pci_bus_id) == ("GPU-fake-0001", "00000000:11:00.0")
    assert (g.ecc_volatile_uncorrected, g.row_remap_failure, g.retired_pages) == (0, False, None)
    assert (g.pcie_width, g.pcie_max_width) == (16, 16)
    assert g.throttle_reasons == frozenset() and not g.lost


def test_gpus_override_generated_by_index_and_can_add() -> None:
    gpus = scenario_gpus(
        parse_scenario(
            json.dumps({"generate": 2, "gpus": [{"index": 1, "temperature": 77}, {"index": 5}]})
        )
    )
    assert [(g.index, g.temperature_c) for g in gpus] == [(0, 40), (1, 77), (5, 40)]


def test_not_supported_group_and_field() -> None:
    [g] = scenario_gpus(
        parse_scenario(
            json.dumps(
                {
                    "gpus": [
                        {
                            "index": 0,
                            "ecc": "not_supported",
                            "nvlink": [
                                {"link": 0, "state": "not_supported", "errors": "not_supported"}
                            ],
                        }
                    ]
                }
            )
        )
    )
    assert g.ecc_volatile_uncorrected is None and g.ecc_aggregate_uncorrected is None
    assert (g.nvlinks[0].up, g.nvlinks[0].errors) == (None, None)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"gpus": [{"index": 0, "ecc": {"volatile": "two"}}]}', "gpus.0.ecc"),
        ('{"gpus": [{"index": 0, "lost": 1}]}', "gpus.0.lost"),
        ('{"gpus": [{"index": 0, "throttle_reasons": ["too_hot"]}]}', "gpus.0.throttle_reasons"),
        ('{"xid_events": [{"gpu": 1}]}', "xid_events.0.xid"),
        ('{"generate": 65}', "generate"),
        ('{"gpu": []}', "gpu"),
        ("[]", "(top level)"),
    ],
)
def test_errors_name_the_key(text: str, where: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_scenario(text)
    assert str(info.value).startswith(where)


def test_events_delivered_once_and_new_ones_after_edit(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write(path, {"generate": 4, "xid_events": [{"gpu": 1, "xid": 13, "id": "a"}]})
    backend = FakeBackend(path)
    assert [(e.gpu, e.xid) for e in backend.sample().events] == [(1, 13)]
    assert backend.sample().events == []
    write(
        path,
        {
            "generate": 4,
            "xid_events": [{"gpu": 1, "xid": 13, "id": "a"}, {"gpu": 2, "xid": 79, "id": "b"}],
        },
    )
    assert [(e.gpu, e.xid) for e in backend.sample().events] == [(2, 79)]


def test_unchanged_file_is_not_reparsed(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write(path, {"generate": 1})
    backend = FakeBackend(path)
    backend.sample()
    st = path.stat()
    path.write_text('{"generate": 2}')  # same size, mtime put back: looks unchanged
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert len(backend.sample().gpus) == 1


def test_deleted_file_keeps_previous_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write(path, {"generate": 3})
    backend = FakeBackend(path)
    backend.sample()
    path.unlink()
    sample = backend.sample()
    assert len(sample.gpus) == 3 and sample.warnings
    write(path, {"generate": 2})
    sample = backend.sample()
    assert len(sample.gpus) == 2 and not sample.warnings


def test_nvml_error_scenario(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write(path, {"generate": 8, "nvml_error": "Driver Not Loaded"})
    sample = FakeBackend(path).sample()
    assert sample.gpus == [] and sample.error == "NVML: Driver Not Loaded"
