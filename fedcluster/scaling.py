"""``standardize``: every feature to mean 0 and variance 1, federated (NumPy only).

The server learns each feature's mean and variance from one round of per-device sums and
sums of squares (the data summary with ``moments``: :meth:`Scaling.from_moments`, as
scikit-learn's ``StandardScaler``: a feature with variance 0 keeps scale 1). From then on
every request to a device carries the two (d,) arrays ``scale-shift`` and ``scale-factor``
and the device clusters ``(x − shift) / factor`` of its own points (:func:`scaled`); the
device stays stateless. Results are written in the original units (:meth:`Scaling.undo`);
a point's nearest center is taken in the standardized space (:meth:`Scaling.nearest`), as
a scikit-learn ``StandardScaler`` → ``KMeans`` pipeline does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

SHIFT, FACTOR = "scale-shift", "scale-factor"  # the request arrays that carry it


@dataclass(frozen=True)
class Scaling:
    """``x ↦ (x − mean) / scale`` per feature."""

    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def from_moments(cls, points: float, sums: np.ndarray, sumsq: np.ndarray) -> "Scaling":
        """From the federation's point count and per-feature sums and sums of squares."""
        if points <= 0:
            raise ValueError("standardize needs at least one point")
        mean = np.asarray(sums, dtype=np.float64) / points
        variance = np.maximum(np.asarray(sumsq, dtype=np.float64) / points - mean**2, 0.0)
        scale = np.sqrt(variance)
        # a constant feature (or one whose spread is rounding) keeps its unit, as StandardScaler
        scale[scale <= 1e-12 * np.maximum(np.abs(mean), 1.0)] = 1.0
        return cls(mean, scale)

    def apply_moments(self, points: float, sums: np.ndarray, sumsq: np.ndarray,
                      size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-feature sum and sum of squares of ``points`` points in standardized units,
        and the size of a coordinate for rounding slack (the offset counts: the
        standardized moments come from the original ones by subtraction)."""
        mean, scale = self.mean, self.scale
        return ((sums - points * mean) / scale, (sumsq - 2 * mean * sums + points * mean**2) / scale**2,
                (size + np.abs(mean)) / scale)

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "Scaling | None":
        """The scaling a request carries, or None; ``ValueError`` for a malformed one."""
        if SHIFT not in arrays and FACTOR not in arrays:
            return None
        if SHIFT not in arrays or FACTOR not in arrays:
            raise ValueError(f"a standardized request needs both {SHIFT!r} and {FACTOR!r}")
        mean, scale = (np.asarray(arrays[name], dtype=np.float64) for name in (SHIFT, FACTOR))
        if mean.ndim != 1 or mean.shape != scale.shape:
            raise ValueError(f"{SHIFT!r} and {FACTOR!r} must be two vectors of one length, got {mean.shape} and {scale.shape}")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(scale)) and np.all(scale > 0)):
            raise ValueError(f"{SHIFT!r} must be finite and {FACTOR!r} finite and positive")
        return cls(mean, scale)

    @classmethod
    def of_run(cls, result: Mapping[str, Any]) -> "Scaling | None":
        """The scaling a finished run recorded in its result.json (``standardize``), or None;
        ``ValueError`` naming what is wrong with a record no run writes (a hand-edited or
        damaged file: a scale of 0 once gave every point label 0, silently)."""
        if not isinstance(result, Mapping):
            raise ValueError(f"result.json holds a JSON {type(result).__name__}, not a run's record")
        record = result.get("standardize")
        if not record:
            return None
        if not isinstance(record, Mapping) or not {"mean", "scale"} <= set(record):
            raise ValueError("result.json's standardize record must hold the lists 'mean' and 'scale'")
        try:
            mean, scale = (np.asarray(record[name], dtype=np.float64) for name in ("mean", "scale"))
        except (TypeError, ValueError, OverflowError):
            raise ValueError("result.json's standardize mean and scale must be lists of numbers") from None
        if mean.ndim != 1 or mean.shape != scale.shape or mean.size == 0:
            raise ValueError(f"result.json's standardize mean and scale must be two lists of one length, got {mean.shape} and {scale.shape}")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(scale)) and np.all(scale > 0)):
            raise ValueError("result.json's standardize mean must be finite and its scale finite and positive")
        if np.max(np.abs(mean)) > 1e150 or np.min(scale) < 1e-150:
            raise ValueError("result.json's standardize record has a mean above 1e150 or a scale below 1e-150 in size: "
                             "standardized points would overflow float64")
        return cls(mean, scale)

    @classmethod
    def of_folder(cls, folder: str | Path) -> "Scaling | None":
        import json

        file = Path(folder) / "result.json"
        if not file.is_file():
            return None
        try:
            result = json.loads(file.read_text())
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{file} is not readable JSON ({type(exc).__name__})") from None
        return cls.of_run(result)

    def arrays(self) -> dict[str, np.ndarray]:
        return {SHIFT: self.mean, FACTOR: self.scale}

    def apply(self, X: np.ndarray) -> np.ndarray:
        return (np.asarray(X, dtype=np.float64) - self.mean) / self.scale

    def undo(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, dtype=np.float64) * self.scale + self.mean

    def nearest(self, X: np.ndarray, centers: np.ndarray) -> np.ndarray:
        """The nearest of ``centers`` (original units) to every row of ``X``, in the standardized space."""
        from .lloyd import nearest

        return nearest(self.apply(X), self.apply(centers))

    def record(self) -> dict[str, list[float]]:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist()}


def scaled(data: Any, arrays: Mapping[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]]:
    """A device's data as a standardized request asks for it, and the request without the
    scaling arrays. The scaled points are kept (one copy per scaling) for the later
    messages of the same run."""
    scaling = Scaling.from_arrays(arrays)
    rest = {name: value for name, value in arrays.items() if name not in (SHIFT, FACTOR)}
    if scaling is None or data.points is None:
        return data, rest
    if scaling.mean.shape[0] != data.points.shape[1]:
        raise ValueError(f"the standardization has {scaling.mean.shape[0]} features, the device's data {data.points.shape[1]}")
    key = ("scaled", scaling.mean.tobytes(), scaling.scale.tobytes())
    cache = data.extra.setdefault("scaled", {})
    if key not in cache:
        cache.clear()
        cache[key] = type(data)(points=scaling.apply(data.points), source=data.source, extra=data.extra)
    return cache[key], rest
