"""The example recipe: a small GPT (``model.py``) on the Python standard library's sources (``data.py``), trained by
``task.train`` from the Hydra configs in ``conf/`` (``examples/train.py``) or by the Lightning CLI
(``examples/cli.py``)."""
