"""What the lab adds to the library (entry point "jaxformer.plugins"): its commands
(`jaxformer_lab.cli`) and the Bible datasets, registered by name."""

from jaxformer.data import registry
from jaxformer_lab.cli import COMMANDS, add_commands, run

__all__ = ["COMMANDS", "add_commands", "run"]


def _bible(name: str, attribute: str):
    from jaxformer_lab import bible

    return getattr(bible, attribute)(name)


registry.register(
    "bible",
    registry.Family(
        about="the Bibles: SRC-TGT, SRC+EXTRA-TGT or VER-lm, e.g. wyc-web, web-lm",
        owns=lambda name: "-" in name,  # parse_dataset names what is wrong with the rest
        check=lambda name: _bible(name, "parse_dataset"),
        load=lambda name: _bible(name, "load"),
    ),
)
