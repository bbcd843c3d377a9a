"""The page's answer to the dashboard: which batch of charts it has drawn (flow control).

The dashboard sends whole figures, and ipywidgets delivers every message it is given: a browser on
a loaded machine drew them slower than the kernel sent them, and its charts fell minutes behind the
run. So the dashboard numbers each batch it sends and sends the next one only once the page says
it has drawn the last. Without an answer it sends anyway after `ANSWER_WAIT_S`: no page may be
open (nbmake, a closed tab, a hidden tab that draws no frames), or the kernel may be running a
cell, which holds back every message from the page until it ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import anywidget

__all__ = ["PageAck", "ANSWER_WAIT_S"]

ANSWER_WAIT_S = 5.0

# Answers once the page has handled everything that came before the batch's number (widget
# messages are handled in order) and drawn a frame: the next animation frame, then the tasks
# queued before it (plotly's renderer draws in one).
_ESM = """
export default {
  initialize({ model }) {
    model.on("msg:custom", (msg) => {
      if (typeof msg.batch !== "number") return;
      requestAnimationFrame(() => setTimeout(() => model.send({ drawn: msg.batch }), 0));
    });
  },
};
"""


class PageAck(anywidget.AnyWidget):
    """Counts batches sent and batches the page says it drew; `ready()` says whether to send."""

    _esm = _ESM

    def __init__(self, on_drawn: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.sent = 0                 # batches sent
        self.drawn = 0                # the last batch the page said it drew
        self._sent_at = -math.inf     # monotonic time of the last batch
        self._on_drawn = on_drawn
        self.on_msg(self._answer)

    def batch_sent(self) -> None:
        self.sent += 1
        self._sent_at = time.monotonic()
        self.send({"batch": self.sent})

    def ready(self) -> bool:
        """The page has drawn every batch, or has not answered for ANSWER_WAIT_S."""
        return self.drawn >= self.sent or time.monotonic() - self._sent_at >= ANSWER_WAIT_S

    def _answer(self, _widget, content, _buffers) -> None:
        # From the kernel's main thread, when it is free. Only our own frontend code sends here,
        # but a message is checked before it is believed.
        drawn = content.get("drawn") if isinstance(content, dict) else None
        if isinstance(drawn, int) and not isinstance(drawn, bool) and 0 < drawn <= self.sent:
            self.drawn = max(self.drawn, drawn)
            if self._on_drawn is not None:
                self._on_drawn()
