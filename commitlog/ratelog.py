# Owns rate-limited logging of what a remote can cause at will (refused peer
# connections, dropped peer messages, bad admin requests): at most `lines`
# lines per `window` seconds reach the log, the rest are counted and
# summed up in one line when the next window opens.  Pure: the caller
# passes its clock's time, so it works under trio's clock and in tests.
import logging
import math

import attrs


@attrs.define
class LogBudget:
    lines: int = 20
    window: float = 1.0
    _start: float = -math.inf
    _logged: int = 0
    suppressed: int = 0  # lines left out in the current window

    def log(self, logger: logging.Logger, level: int, now: float, msg: str, *args, **kwargs) -> bool:
        """Log the line if the window has room (True), else count it."""
        if now - self._start >= self.window:
            if self.suppressed:
                logger.log(level, "(%d more such lines were not logged)", self.suppressed)
            self._start, self._logged, self.suppressed = now, 0, 0
        if self._logged >= self.lines:
            self.suppressed += 1
            return False
        self._logged += 1
        logger.log(level, msg, *args, **kwargs)
        return True
