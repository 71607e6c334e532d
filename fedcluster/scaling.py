"""``standardize``: every feature to mean 0 and variance 1, federated (NumPy only).

The server learns each feature's mean and variance from one round of per-device sums and
scatters about each device's mean (the data summary with ``moments``, pooled by the parallel
axis theorem: :meth:`Scaling.from_summaries`, as scikit-learn's ``StandardScaler``: a feature
with variance 0 keeps scale 1): the same scaling wherever the data lie. From then on
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
    def from_summaries(cls, counts: np.ndarray, sums: np.ndarray, scatters: np.ndarray) -> "Scaling":
        """From every device's point count (J,), per-feature sum (J, d) and scatter about its
        own mean (J, d): the pooled mean, and the pooled variance by the parallel-axis
        (Chan et al.) combination, so that it is the same wherever the data lie (a pooled
        Σx²/n − mean² is the square of the offset minus itself: at 1e9, rounding)."""
        from .lloyd import pooled_scatter

        counts = np.asarray(counts, dtype=np.float64)
        points = float(counts.sum())
        if points <= 0:
            raise ValueError("standardize needs at least one point")
        mean = np.asarray(sums, dtype=np.float64).sum(axis=0) / points
        variance = np.maximum(pooled_scatter(counts, sums, scatters) / points, 0.0)
        scale = np.sqrt(variance)
        # a constant feature (or one whose spread is rounding: below a coordinate's own rounding
        # at its mean, fedcluster.bounds.coordinate_rounding) keeps its unit, as StandardScaler
        from .bounds import coordinate_rounding

        scale[scale <= np.maximum(coordinate_rounding(mean), 1e-300)] = 1.0
        return cls(mean, scale)

    def apply_moments(
        self, points: float, sums: np.ndarray, scatter: np.ndarray, rounding: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A device's per-feature sum and scatter about its mean, and how far one of its
        coordinates may be off by rounding (``rounding``), in standardized units: the sum of
        ``points`` points ``(x − mean)/scale`` is ``(S − n·mean)/scale``; the scatter scales by
        ``1/scale²`` (a shift changes no scatter); the rounding is the original one, the
        shift's own and the standardized coordinates', over the scale."""
        from .bounds import coordinate_rounding

        mean, scale = self.mean, self.scale
        return ((sums - points * mean) / scale, scatter / scale**2, (rounding + coordinate_rounding(mean)) / scale)

    def scale_declared(self, declared: Any) -> None:
        """A device's declaration (:class:`fedcluster.bounds.Declared`: box, moments and
        coordinate rounding) in standardized units, in place."""
        from .bounds import coordinate_rounding

        rounding = declared.coordinate_rounding()
        declared.low, declared.high = self.apply(declared.low), self.apply(declared.high)
        if declared.moment_sum is not None:
            declared.moment_sum, declared.moment_scatter, rounding = self.apply_moments(
                declared.points, declared.moment_sum, declared.moment_scatter, rounding
            )
        else:
            rounding = (rounding + coordinate_rounding(self.mean)) / self.scale
        declared.rounding = np.maximum(rounding, coordinate_rounding(declared.low, declared.high))
        declared.scaled = True

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "Scaling | None":
        """The scaling a request carries, or None; ``ValueError`` for a malformed one."""
        if SHIFT not in arrays and FACTOR not in arrays:
            return None
        if SHIFT not in arrays or FACTOR not in arrays:
            raise ValueError(f"a standardized request needs both {SHIFT!r} and {FACTOR!r}")
        mean, scale = (np.asarray(arrays[name], dtype=np.float64) for name in (SHIFT, FACTOR))
        if mean.ndim != 1 or mean.shape != scale.shape:
            raise ValueError(
                f"{SHIFT!r} and {FACTOR!r} must be two vectors of one length, got {mean.shape} and {scale.shape}"
            )
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
            raise ValueError(
                f"result.json's standardize mean and scale must be two lists of one length, got {mean.shape} and "
                f"{scale.shape}"
            )
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(scale)) and np.all(scale > 0)):
            raise ValueError("result.json's standardize mean must be finite and its scale finite and positive")
        if np.max(np.abs(mean)) > 1e150 or np.min(scale) < 1e-150:
            raise ValueError(
                "result.json's standardize record has a mean above 1e150 or a scale below 1e-150 in size: "
                "standardized points would overflow float64"
            )
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
        raise ValueError(
            f"the standardization has {scaling.mean.shape[0]} features, the device's data {data.points.shape[1]}"
        )
    key = ("scaled", scaling.mean.tobytes(), scaling.scale.tobytes())
    cache = data.extra.setdefault("scaled", {})
    if key not in cache:
        cache.clear()
        cache[key] = type(data)(points=scaling.apply(data.points), source=data.source, extra=data.extra)
    return cache[key], rest
