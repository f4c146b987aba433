"""Lightning's two Fabric examples (the vendored ``fabric_language_model.py`` and ``fabric_image_classifier.py``), one
after the other in each rank, as ``fabric run`` starts them: ``fabric run [OPTIONS] fabric_examples.py OUT``, in a
working directory holding ``data/wikitext-2.txt``. Each rank's output goes to ``OUT/rank<r>.txt``, followed by one JSON
line per Fabric the examples built (accelerator, strategy, precision) and whether ``lightning_gaudi`` was imported,
which this program never does."""

import contextlib
import json
import os
import runpy
import sys
from pathlib import Path

from lightning.fabric import Fabric

HERE = Path(__file__).parent
EXAMPLES = [
    ["fabric_language_model.py"],
    ["fabric_image_classifier.py", "--epochs", "2", "--batch-size", "16", "--log-interval", "1"],
]


def _recording(built: list[dict[str, str]]) -> None:
    init = Fabric.__init__

    def record(self: Fabric, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)
        facts = (type(self.accelerator), type(self.strategy), type(self.strategy.precision))
        built.append(
            dict(zip(("accelerator", "strategy", "precision"), (kind.__name__ for kind in facts), strict=True))
        )

    Fabric.__init__ = record  # type: ignore[method-assign]


if __name__ == "__main__":
    out = Path(sys.argv[1])
    built: list[dict[str, str]] = []
    _recording(built)
    with open(out / f"rank{os.environ['RANK']}.txt", "w") as file, contextlib.redirect_stdout(file):
        for name, *args in EXAMPLES:
            sys.argv = [str(HERE / name), *args]
            runpy.run_path(sys.argv[0], run_name="__main__")
        for facts in built:
            print(json.dumps({**facts, "lightning_gaudi": "lightning_gaudi" in sys.modules}))
