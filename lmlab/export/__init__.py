"""Running lmlab models outside lmlab: ONNX export (``onnx``). Import the module you need; this
package imports nothing itself (onnx, onnxscript and onnxruntime are the optional ``export``
extra)."""
