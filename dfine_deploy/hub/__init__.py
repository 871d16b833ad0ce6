"""A model reference (size name, config file, checkpoint) made into a PyTorch model: `loader`
(`load_model`, `resolve_spec`) and its command, `cli` (`dfine-info`). Above `model/` (the network)
and `config/` (the YAML files), below the runtime's torch backend and the export and training stages.
"""
