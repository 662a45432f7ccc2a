"""The training application: a run config in, checkpoints and a metrics log out.

``config.py`` (the run config's typed sections, ``config_yaml.py`` its YAML),
``model_from_config.py`` (the config's model section as a GPTConfig, the memory check),
``init_from.py`` (``model.init_from``: a pretrained source fills the config in),
``setup.py`` (what a run is built from: ranks, device, samplers), ``precision.py``
(``system.dtype``'s autocast and fp16's loss scaler), ``trainer.py`` (the loop),
``run_directory.py``, ``run_lock.py``, ``run_state.py`` (a run's files, its lock, what a
checkpoint resumes), ``interrupt.py`` (Ctrl-C), ``periodic_hellaswag.py`` (HellaSwag every
``eval.hellaswag_interval`` iterations), ``tensorboard_log.py`` and ``plot_runs.py``
(metrics as TensorBoard scalars and as pictures).

Application layer: it may import the engine, ``nn``/``optim``, ``data``, ``checkpoint``,
``pretrained``, ``distributed`` and the foundation, and ``evaluation`` beside it (the
periodic HellaSwag); never ``profiler``/``bench`` beside it nor the CLI above it.
"""
