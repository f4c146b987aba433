"""The example GPT with the Lightning CLI (``lightning-gaudi``), its tuned settings in ``gpt_recipe/cli.yaml``.

    python examples/cli.py fit --config examples/gpt_recipe/cli.yaml
    python examples/cli.py fit --config examples/gpt_recipe/cli.yaml --trainer.max_steps 50 --data.batch_size 16
    python examples/cli.py fit --config examples/gpt_recipe/cli.yaml --trainer.devices 2 --trainer.strategy hpu_parallel

Running it from ``examples/`` makes ``gpt_recipe`` importable; the installed ``lightning-gaudi`` command does the same
for your own modules (``--model my_pkg.MyModule``).
"""

from gpt_recipe import logs

from lightning_gaudi.app.cli import main

if __name__ == "__main__":
    logs.quiet_upstream_noise()  # no torch deprecation warning or Lightning tips on the console
    main()
