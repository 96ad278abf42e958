"""The first N records of any `ImageRecords` (train_limit / test_limit on streamed data)."""

from __future__ import annotations

import numpy as np

from vitkit.data.image_decoder import DecodedImage
from vitkit.data.sources.records import ImageRecords


class FirstRecords:
    """Records 0 .. count - 1 of `records`, same classes."""

    streamed = True

    def __init__(self, records: ImageRecords, count: int) -> None:
        self.records = records
        self.count = min(count, len(records))
        self.name, self.classes = records.name, records.classes

    def __len__(self) -> int:
        return self.count

    @property
    def labels(self) -> np.ndarray:
        return np.asarray(self.records.labels)[:self.count]

    def read(self, index: int, channels: int) -> DecodedImage:
        return self.records.read(index, channels)

    def where(self, index: int) -> str:
        return self.records.where(index)
