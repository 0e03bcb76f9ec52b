"""Request bodies of the inference server: TensorFlow Serving's REST predict shapes -> input tensors.

Pure functions (no HTTP, no model): :func:`parse_predict_body` turns a ``POST .../:predict`` body
into a float32 batch of the model's input shape, or raises :class:`RequestError` naming the
problem (the server answers it as HTTP 400). The accepted forms are documented in
:mod:`testbed.serve.server`; in addition, a model whose input is an RGB frame [H, W, 3]
accepts ``{"b64": <JPEG or PNG of any size>}``: decoded (simplejpeg; PIL for PNG and CMYK JPEG),
converted to RGB, resized bilinearly to W x H if it differs, pixels / 255 -- the encoded camera frame a real edge app
sends (TF Serving's convention for binary inputs; the decode is the server's, as in a serving
graph that starts with ``decode_jpeg``). :func:`predict_response` answers a multi-output model
(:class:`testbed.serve.calls.NamedOutputs`) in TF Serving's multi-output shapes.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping
from itertools import chain
from typing import Any

import numpy as np
import orjson

from testbed.plan import zoo

#: Most inputs accepted in one request (a bigger batch is a 400).
MAX_INSTANCES = 256
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"
#: Largest decoded frame [pixels] (a 4K frame is 8.3 M): bigger is a 400, not a memory blow-up.
MAX_FRAME_PIXELS = 4096 * 4096
#: JPEG colour spaces decoded by simplejpeg; others (CMYK, YCCK) by PIL, whose CMYK -> RGB differs.
SIMPLEJPEG_COLORSPACES = ("YCbCr", "Gray", "RGB")
#: Decimals kept in multi-output answers (float32 carries ~7 significant digits; 6 keeps the JSON short).
OUTPUT_DECIMALS = 6



# Not a TestbedError: an HTTP refusal, raised here and answered in serve/server.py; it never reaches the CLI.
class RequestError(Exception):
    """A request the server refuses; ``status`` is the HTTP status, ``str(exc)`` the reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def decode_b64(item: dict[str, Any], input_shape: tuple[int, ...], where: str) -> tuple[np.ndarray, bool]:
    """One binary input ``{"b64": s}`` -> (float32 array of ``input_shape``, whether it is an
    image's pixels): raw float32 LE, a greyscale PNG, or an RGB frame (:func:`decode_frame`).
    Pixels are finite by construction, so the caller need not scan them for NaN.

    Raises:
        RequestError(400): not base64, wrong length, an undecodable or wrongly sized PNG.
    """
    if list(item) != ["b64"] or not isinstance(item["b64"], str):
        raise RequestError(400, f"{where}: a binary input must be {{\"b64\": \"<base64 string>\"}}")
    try:
        raw = base64.b64decode(item["b64"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(400, f"{where}: invalid base64 ({exc})") from None
    if len(input_shape) == 3 and input_shape[2] == 3 and (raw.startswith(PNG_MAGIC) or raw.startswith(JPEG_MAGIC)):
        return decode_frame(raw, input_shape, where), True
    if raw.startswith(PNG_MAGIC):
        if len(input_shape) != 3 or input_shape[2] != 1:
            raise RequestError(400, f"{where}: PNG input only for greyscale image models (this one takes "
                                    f"{list(input_shape)})")
        from PIL import Image

        try:
            with Image.open(io.BytesIO(raw)) as img:
                if img.mode != "L" or img.size != (input_shape[1], input_shape[0]):
                    raise RequestError(400, f"{where}: PNG must be 8-bit greyscale (mode L) {input_shape[1]}x"
                                            f"{input_shape[0]}, got mode {img.mode} {img.size[0]}x{img.size[1]}")
                arr = np.asarray(img, dtype=np.float32) / 255.0
        except RequestError:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the client's
            raise RequestError(400, f"{where}: cannot decode PNG ({type(exc).__name__}: {exc})") from None
        return arr.reshape(input_shape), True
    need = int(np.prod(input_shape)) * 4
    if len(raw) != need:
        raise RequestError(400, f"{where}: binary input has {len(raw)} bytes; raw float32 {list(input_shape)} "
                                f"needs {need} (or send an 8-bit greyscale PNG)")
    return np.frombuffer(raw, dtype="<f4").reshape(input_shape).astype(np.float32), False


def decode_frame(raw: bytes, input_shape: tuple[int, ...], where: str) -> np.ndarray:
    """A JPEG / PNG camera frame -> float32 [H, W, 3] RGB in [0, 1] of ``input_shape`` (bilinear resize if needed).

    A JPEG is decoded by simplejpeg (libjpeg-turbo straight into a numpy array): 213-297 us per
    frame here with the caches cold, as after a model call, against 541-634 us through PIL,
    which decodes into its own buffer and copies it out (``benchmarks/server_bench.py --decode``);
    both are libjpeg-turbo with the same IDCT and upsampling, and give the same pixels (checked
    by ``tests/test_real_zoo.py``). A JPEG simplejpeg cannot take, a CMYK / YCCK one and every PNG
    go through PIL; resizing is PIL's bilinear filter.

    Raises:
        RequestError(400): undecodable image, or more than MAX_FRAME_PIXELS pixels.
    """
    h, w = int(input_shape[0]), int(input_shape[1])
    rgb = _jpeg_rgb(raw, where) if raw.startswith(JPEG_MAGIC) else None
    if rgb is None:
        rgb = _pil_rgb(raw, where)
    if rgb.shape[:2] != (h, w):
        from PIL import Image

        rgb = np.asarray(Image.fromarray(rgb).resize((w, h), Image.BILINEAR))
    # one pass, uint8 -> float32 / 255 in float32: the same bits as astype then divide
    return np.divide(rgb, np.float32(255.0), dtype=np.float32)


def _too_large(width: int, height: int, where: str) -> RequestError:
    return RequestError(400, f"{where}: image of {width}x{height} pixels; at most {MAX_FRAME_PIXELS} pixels")


def _jpeg_rgb(raw: bytes, where: str) -> np.ndarray | None:
    """uint8 [h, w, 3] pixels of a JPEG by simplejpeg; None if it cannot decode it (PIL then tries).

    Raises:
        RequestError(400): more than MAX_FRAME_PIXELS pixels (read from the header, before decoding).
    """
    import simplejpeg

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(raw)
    except ValueError:
        return None
    if width * height > MAX_FRAME_PIXELS:
        raise _too_large(width, height, where)
    if colorspace not in SIMPLEJPEG_COLORSPACES:  # CMYK / YCCK: PIL's conversion, as before
        return None
    try:
        return simplejpeg.decode_jpeg(raw, colorspace="RGB")
    except ValueError:
        return None


def _pil_rgb(raw: bytes, where: str) -> np.ndarray:
    """uint8 [h, w, 3] RGB pixels of any image PIL reads.

    Raises:
        RequestError(400): undecodable, or more than MAX_FRAME_PIXELS pixels.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as img:
            if img.size[0] * img.size[1] > MAX_FRAME_PIXELS:
                raise _too_large(img.size[0], img.size[1], where)
            return np.asarray(img if img.mode == "RGB" else img.convert("RGB"))
    except RequestError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the client's
        raise RequestError(400, f"{where}: cannot decode image ({type(exc).__name__}: {exc})") from None


def _fast_array(data: list, input_shape: tuple[int, ...]) -> np.ndarray | None:
    """Nested lists of exactly [N, *input_shape] numbers -> float32 array; None if anything differs.

    Checks every level's lengths, then flattens: ~2.5x faster than ``np.asarray`` on nested lists
    (0.15 vs 0.42 ms for a 32x32x1 image here). On None the caller takes the slow path, which
    names the problem.
    """
    x = data
    for n in input_shape:
        if not all(type(r) is list and len(r) == n for r in x):
            return None
        x = list(chain.from_iterable(x))
    try:
        return np.array(x, dtype=np.float32).reshape(len(data), *input_shape)
    except (ValueError, TypeError, OverflowError):
        return None


def parse_predict_body(body: bytes, input_shape: tuple[int, ...] = zoo.INPUT_SHAPE) -> tuple[np.ndarray, bool]:
    """Decode a TF Serving predict body into inputs float32 [N, *input_shape] and whether it was columnar.

    Raises:
        RequestError(400): not JSON, not an object, neither or both of ``instances`` / ``inputs``,
            an unknown signature or input name, not numbers, ragged, wrong shape, bad ``b64``,
            non-finite values, empty or more than MAX_INSTANCES inputs.
    """
    try:
        doc = orjson.loads(body)  # 3-4x faster than json on a 32x32 image of floats (~0.35 vs ~1.3 ms)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RequestError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(doc, dict):
        raise RequestError(400, "body must be a JSON object with 'instances' (row form) or 'inputs' (columnar)")
    if ("instances" in doc) == ("inputs" in doc):
        raise RequestError(400, "body must have exactly one of 'instances' (row form) or 'inputs' (columnar)")
    sig = doc.get("signature_name", zoo.SIGNATURE_KEY)
    if sig != zoo.SIGNATURE_KEY:
        raise RequestError(400, f"signature_name {sig!r}: the only signature is {zoo.SIGNATURE_KEY!r}")
    extra = sorted(set(doc) - {"instances", "inputs", "signature_name"})
    if extra:
        raise RequestError(400, f"unknown key(s) {extra} in the body")
    columnar = "inputs" in doc
    key = "inputs" if columnar else "instances"
    data = doc[key]
    if columnar and isinstance(data, dict) and list(data) != ["b64"]:
        if list(data) != [zoo.INPUT_NAME]:
            raise RequestError(400, f"'inputs' names {sorted(data)}; the only input is {zoo.INPUT_NAME!r}")
        data = data[zoo.INPUT_NAME]
    if not columnar and isinstance(data, list) and data and all(
            isinstance(r, dict) and list(r) != ["b64"] for r in data):
        if any(list(r) != [zoo.INPUT_NAME] for r in data):
            raise RequestError(400, f"each named instance must be {{{zoo.INPUT_NAME!r}: input}}")
        data = [r[zoo.INPUT_NAME] for r in data]
    if not isinstance(data, list) or not data:
        raise RequestError(400, f"{key!r} must be a non-empty list of inputs {list(input_shape)}")
    if len(data) > MAX_INSTANCES:
        raise RequestError(400, f"{key!r} has {len(data)} inputs; at most {MAX_INSTANCES} per request")
    pixels_only = False  # every input an image's pixels: finite by construction, no NaN scan
    if any(isinstance(e, dict) for e in data):
        rows, pixels = [], []
        for i, e in enumerate(data):
            if isinstance(e, dict):
                arr, is_pixels = decode_b64(e, input_shape, f"{key}[{i}]")
                rows.append(arr)
                pixels.append(is_pixels)
            else:
                pixels.append(False)
                try:
                    rows.append(np.asarray(e, dtype=np.float32))
                except (ValueError, TypeError, OverflowError) as exc:
                    raise RequestError(400, f"{key}[{i}] is not a rectangular array of numbers: {exc}") from None
                if rows[-1].shape != tuple(input_shape):
                    raise RequestError(400, f"wrong shape: {key}[{i}] is {list(rows[-1].shape)}, expected "
                                            f"{list(input_shape)}")
        x = rows[0][None] if len(rows) == 1 else np.stack(rows)  # one frame: a view, not a copy
        pixels_only = all(pixels)
    else:
        x = _fast_array(data, input_shape)
        if x is None:
            try:
                x = np.asarray(data, dtype=np.float32)
            except (ValueError, TypeError, OverflowError) as exc:
                raise RequestError(400, f"{key!r} is not a rectangular array of numbers: {exc}") from None
    expected = [len(data), *input_shape]
    if list(x.shape) != expected:
        raise RequestError(400, f"wrong shape: {key!r} is {list(x.shape)}, expected {expected} "
                                f"(each input {list(input_shape)}, float32)")
    if not pixels_only and not np.isfinite(x).all():
        raise RequestError(400, f"{key!r} holds NaN or infinite values")
    return x, columnar


def predict_response(result: np.ndarray | Mapping[str, np.ndarray], columnar: bool) -> dict[str, Any]:
    """The JSON answer of a predict call (TF Serving REST API); ``result`` [N, ...] or named arrays [N, ...].

    One output: ``{"predictions": rows}`` (row form) / ``{"outputs": rows}`` (columnar). Several
    (a mapping such as :class:`~testbed.serve.calls.NamedOutputs`): ``{"predictions": [{name: value, ...} per
    input]}`` / ``{"outputs": {name: [values]}}``, values rounded to OUTPUT_DECIMALS.
    """
    if not isinstance(result, Mapping):  # NamedOutputs, or the plain dict a batch slice may give
        return {"outputs" if columnar else "predictions": result.tolist()}
    lists = {k: np.round(np.asarray(v, dtype=np.float64), OUTPUT_DECIMALS).tolist() for k, v in result.items()}
    if columnar:
        return {"outputs": lists}
    n = len(next(iter(lists.values())))
    return {"predictions": [{k: v[i] for k, v in lists.items()} for i in range(n)]}


def encode_json(doc: Any) -> bytes:
    """``doc`` as JSON bytes, by orjson: 1000 class probabilities in 25 us against 481 us for the
    standard library's ``json.dumps`` here (``python -m timeit``, best of 5); both write a float
    as its shortest round-trip form, so the numbers are the same."""
    return orjson.dumps(doc)


def metadata_response(name: str, model: Any) -> dict[str, Any]:
    """``GET /v1/models/{name}/metadata``: the signature_def of ``model`` in TF Serving's JSON shape."""
    def tensor(key: str, dims: list[int]) -> dict[str, Any]:
        return {"dtype": "DT_FLOAT", "name": key,
                "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in dims], "unknown_rank": False}}

    outputs = model.info.get("outputs") or {zoo.OUTPUT_NAME: [model.classes]}
    sig = {"inputs": {zoo.INPUT_NAME: tensor(f"{zoo.SIGNATURE_KEY}_{zoo.INPUT_NAME}:0", [-1, *model.input_shape])},
           "outputs": {k: tensor(f"StatefulPartitionedCall:{i}", [-1, *dims])
                       for i, (k, dims) in enumerate(outputs.items())},
           "method_name": "tensorflow/serving/predict"}
    return {"model_spec": {"name": name, "signature_name": "", "version": "1"},
            "metadata": {"signature_def": {"signature_def": {zoo.SIGNATURE_KEY: sig}}}}
