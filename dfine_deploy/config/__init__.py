"""Official-layout D-FINE YAML files → one merged dict → typed settings.

- `tree.py`: generic YAML loading (`__include__`, `-u a.b=c` overrides, where each key came from);
- `layout.py`: every key the official D-FINE files use, checked with the nearest valid name on a typo;
- `reader.py`: typed reading of a merged dict, errors naming the key and its file;
- `builders.py`: the D-FINE builders (`ModelSpec`, `DataSettings`, `TrainSettings`);
- `core.py`: `Config`, `load_config`, `format_config`.

Like the rest of the runtime boundary, this package imports no torch.
"""

from dfine_deploy.config.core import Config, format_config, load_config
from dfine_deploy.config.tree import OVERRIDE_ORIGIN, parse_override

__all__ = ["OVERRIDE_ORIGIN", "Config", "format_config", "load_config", "parse_override"]
