"""The application around the plugin, optional extras it never needs: the Hydra app (:mod:`.hydra`: config schemas,
resolvers, the per-job rank launcher; ``pip install ".[hydra]"``) and the ``lightning-gaudi`` command (:mod:`.cli`;
``pip install ".[cli]"``)."""
