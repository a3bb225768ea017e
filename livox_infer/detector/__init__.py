"""The BEV detector: config files, network, targets/losses, decoding + NMS, safetensors weights.

Public API: `ModelConfig.load(name_or_path)`, `build_model(cfg)`, `load_weights(model, cfg, path)`,
`save_weights(model, cfg, path)`, `InferenceModel` (network + static top-k decode),
`select_detections` (thresholds + rotated NMS), `bev_iou` / `iou_3d` / `rotated_nms`.
"""

from livox_infer.detector.boxes import bev_iou, iou_3d, rotated_nms
from livox_infer.detector.config import ModelConfig
from livox_infer.detector.network import BevDetector, build_model, fuse_batchnorm
from livox_infer.detector.postprocess import InferenceModel, select_detections, topk_decode
from livox_infer.detector.weights import load_weights, save_weights

__all__ = [
    "BevDetector", "InferenceModel", "ModelConfig", "bev_iou", "build_model", "fuse_batchnorm", "iou_3d",
    "load_weights", "rotated_nms", "save_weights", "select_detections", "topk_decode",
]
