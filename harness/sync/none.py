"""``sync=none``: collectors keep the weights they started with.

Only the header (version, frames, stop flag, values) travels, over the same
Gloo broadcast as ``sync=gloo``, so rounds and shutdown work unchanged.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from torch import nn

from harness.sync.gloo import GlooPublisher, GlooSubscriber


class NonePublisher(GlooPublisher):
    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        super().connect({}, value_names)


class NoneSubscriber(GlooSubscriber):
    def connect(self, models: Mapping[str, nn.Module], value_names: Sequence[str] = ()) -> None:
        super().connect({}, value_names)
