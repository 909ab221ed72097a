"""Leakage measured by a real attack: gradient inversion (DLG, iDLG, Inverting Gradients) on
the updates a run recorded (``record_updates: [round, ...]``), scored by PSNR/SSIM against the
client's true inputs, label recovery and a picture grid. The scores need the ``privacy`` extra
(scikit-image), imported only when a reconstruction is scored."""

from fedbug.attack.driver import attack
from fedbug.attack.inversion import (
    Observation,
    cosine_distance,
    dlg,
    idlg_labels,
    inverting_gradients,
    l2_distance,
    total_variation,
)
from fedbug.results.updates import RecordedUpdate, load_update, recorded

__all__ = [
    "Observation",
    "RecordedUpdate",
    "attack",
    "cosine_distance",
    "dlg",
    "idlg_labels",
    "inverting_gradients",
    "l2_distance",
    "load_update",
    "recorded",
    "total_variation",
]
