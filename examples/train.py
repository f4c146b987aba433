"""Train with a Hydra config from ``conf/`` on Gaudi, or on the emulated HPU when there is no Gaudi.

    python examples/train.py                                  # the example GPT on the standard library's sources
    python examples/train.py trainer.max_steps=50 data.batch_size=16
    python examples/train.py strategy=hpu_parallel trainer.devices=2
    python examples/train.py -m strategy=hpu_parallel trainer.devices=2 strategy.bucket_cap_mb=1,8
    python examples/train.py hparams_search=bucket_sweep      # then: python scripts/sweep_report.py <sweep dir>
    python examples/train.py --cfg job                        # print the composed config and exit

Outputs (checkpoints, CSV log, results.json, the run's log) go to ``logs/<task_name>/runs/<id>/`` or, under ``-m``,
``logs/<task_name>/multiruns/<id>/<job number>/``. The work itself is ``gpt_recipe.task.train``.
"""

from __future__ import annotations

import hydra
from gpt_recipe import logs, task
from omegaconf import DictConfig

import lightning_gaudi.app.hydra  # registers the config schemas and resolvers before Hydra composes


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    logs.setup()  # Lightning's and lightning_gaudi's lines into the run's log; no upstream tips on the console
    return lightning_gaudi.app.hydra.run(cfg, task.train)


if __name__ == "__main__":
    main()
