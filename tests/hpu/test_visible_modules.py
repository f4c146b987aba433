"""``HABANA_VISIBLE_MODULES`` in emulation: a process sees only the cards it lists, as on a Gaudi (where Ray Train's
``HPU`` resource and Kubernetes set it per process)."""

from __future__ import annotations

import pytest
from lightning.pytorch import Trainer

from lightning_gaudi import hpu
from lightning_gaudi.hpu.runtime import visible_emulated_devices


def test_unset_every_card_of_the_node() -> None:
    assert visible_emulated_devices({hpu.DEVICES_ENV: "8"}) == 8


@pytest.mark.parametrize(("listed", "count"), [("3", 1), ("0,5", 2), (" 1 , 2 ", 2), ("", 0)])
def test_the_cards_listed(listed: str, count: int) -> None:
    assert visible_emulated_devices({hpu.DEVICES_ENV: "8", hpu.VISIBLE_MODULES_ENV: listed}) == count


@pytest.mark.parametrize("listed", ["8", "1,1", "a", "-1"])
def test_a_card_the_node_lacks_is_refused(listed: str) -> None:
    with pytest.raises(ValueError, match=r"HABANA_VISIBLE_MODULES=.* ids from 0 to 7"):
        visible_emulated_devices({hpu.DEVICES_ENV: "8", hpu.VISIBLE_MODULES_ENV: listed})


def test_the_backend_counts_the_cards_this_process_sees(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    clean_hpu_env.setenv(hpu.DEVICES_ENV, "8")
    clean_hpu_env.setenv(hpu.VISIBLE_MODULES_ENV, "6")
    assert hpu.get_backend().device_count() == 1
    assert Trainer(accelerator="hpu", devices="auto", logger=False).num_devices == 1
    with pytest.raises(ValueError, match=r"sees only the cards HABANA_VISIBLE_MODULES='6'.*devices='auto'"):
        Trainer(accelerator="hpu", devices=2, logger=False)
    clean_hpu_env.setenv(hpu.VISIBLE_MODULES_ENV, "")  # what Ray empties it to for a worker that asked for no HPU
    assert not hpu.is_available()
