"""Miniature copies of the five papers' datasets in their exact official layouts.

A few classes, three tiny JPEGs per class, the real list formats (and a real MATLAB v5 .mat
for CARS196). Every image is blue with a red rectangle where its bounding box says the
object is, so a crop can be checked by colour. The class ids keep their official ranges
(CUB 1-5 train / 101-104 test, CARS 1-5 / 99-102), so the official splits are exercised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

BACKGROUND, OBJECT = (0, 0, 255), (255, 0, 0)
SIZE = (20, 14)  # width, height
BOX = (3, 2, 13, 10)  # left, top, right, bottom pixel edges of the red object
PER_CLASS = 3

CUB_CLASSES = [1, 2, 3, 4, 5, 101, 102, 103, 104]
CARS_CLASSES = [1, 2, 3, 4, 5, 99, 100, 101, 102]
# a few official Stanford Cars names (ids 1-5); the rest are stand-ins with a body-type word
CARS_NAMES = {
    1: "AM General Hummer SUV 2000",
    2: "Acura RL Sedan 2012",
    3: "Acura TL Sedan 2012",
    4: "Acura TL Type-S 2008",
    5: "Acura TSX Sedan 2012",
    99: "Ford F-450 Super Duty Crew Cab 2012",
    100: "Ford Mustang Convertible 2007",
    101: "Ram C/V Cargo Van Minivan 2012",
    102: "Chevrolet Express Cargo Van 2007",
}


def image(path: Path, size: tuple[int, int] = SIZE, box: tuple[int, ...] = BOX) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    pixels[:] = BACKGROUND
    pixels[box[1] : box[3], box[0] : box[2]] = OBJECT
    Image.fromarray(pixels).save(path, quality=100, subsampling=0)


def cub200(root: Path) -> Path:
    base = root / "CUB_200_2011"
    images, labels, boxes = [], [], []
    classes = [f"{c} {c:03d}.Bird_{c}" for c in range(1, 201)]  # classes.txt lists all 200
    n = 0
    for c in CUB_CLASSES:
        for k in range(PER_CLASS):
            n += 1
            rel = f"{c:03d}.Bird_{c}/Bird_{c}_{k}.jpg"
            image(base / "images" / rel)
            images.append(f"{n} {rel}")
            labels.append(f"{n} {c}")
            boxes.append(f"{n} {BOX[0]}.0 {BOX[1]}.0 {BOX[2] - BOX[0]}.0 {BOX[3] - BOX[1]}.0")
    for name, lines in (("images", images), ("image_class_labels", labels),
                        ("classes", classes), ("bounding_boxes", boxes)):  # fmt: skip
        (base / f"{name}.txt").write_text("\n".join(lines) + "\n")
    (base / "train_test_split.txt").write_text("".join(f"{i} 1\n" for i in range(1, n + 1)))
    return base


def _cars_names() -> np.ndarray:
    names = np.empty((1, 196), dtype=object)
    for c in range(1, 197):
        names[0, c - 1] = CARS_NAMES.get(c, f"Make Model{c} Sedan 2012")
    return names


def _annotations(rows: list[dict]) -> np.ndarray:
    fields = list(rows[0])
    ann = np.empty((1, len(rows)), dtype=[(f, object) for f in fields])
    for i, row in enumerate(rows):
        for f in fields:
            ann[0, i][f] = np.array([[row[f]]]) if not isinstance(row[f], str) else row[f]
    return ann


def _car_rows(path_field: str, folder: str, classes: list[int], start: int = 1) -> list[dict]:
    rows, n = [], start
    for c in classes:
        for _ in range(PER_CLASS):
            name = f"{n:06d}.jpg"
            rows.append({path_field: f"{folder}/{name}" if folder else name,
                         "bbox_x1": BOX[0] + 1, "bbox_y1": BOX[1] + 1, "bbox_x2": BOX[2],
                         "bbox_y2": BOX[3], "class": c, "test": 0})  # fmt: skip
            n += 1
    return rows


def cars196(root: Path) -> Path:
    """The all-in-one layout: cars_annos.mat + car_ims/."""
    from scipy.io import savemat

    rows = _car_rows("relative_im_path", "car_ims", CARS_CLASSES)
    for row in rows:
        image(root / row["relative_im_path"])
    savemat(
        root / "cars_annos.mat", {"annotations": _annotations(rows), "class_names": _cars_names()}
    )
    return root


def cars196_devkit(root: Path) -> Path:
    """The devkit layout: devkit/*.mat, cars_test_annos_withlabels.mat, cars_train/, cars_test/."""
    from scipy.io import savemat

    train = _car_rows("fname", "", CARS_CLASSES[:5] + CARS_CLASSES[7:])
    test = _car_rows("fname", "", CARS_CLASSES[5:7], start=1)
    for folder, rows in (("cars_train", train), ("cars_test", test)):
        for row in rows:
            image(root / folder / row["fname"])
        for row in rows:
            row.pop("test")
    (root / "devkit").mkdir(parents=True, exist_ok=True)
    savemat(root / "devkit" / "cars_meta.mat", {"class_names": _cars_names()})
    savemat(root / "devkit" / "cars_train_annos.mat", {"annotations": _annotations(train)})
    savemat(root / "cars_test_annos_withlabels.mat", {"annotations": _annotations(test)})
    return root


SOP_TRAIN = {1: 1, 2: 1, 3: 2, 4: 2, 5: 2}  # class id -> super-class id
SOP_TEST = {6: 1, 7: 1, 8: 2, 9: 2}
SOP_FOLDERS = {1: "bicycle_final", 2: "cabinet_final"}


def sop(root: Path) -> Path:
    base = root / "Stanford_Online_Products"
    n = 0
    for part, classes in (("train", SOP_TRAIN), ("test", SOP_TEST)):
        lines = ["image_id class_id super_class_id path"]
        for c, s in classes.items():
            for k in range(PER_CLASS):
                n += 1
                rel = f"{SOP_FOLDERS[s]}/{c}{k:02d}_{k}.JPG"
                image(base / rel)
                lines.append(f"{n} {c} {s} {rel}")
        (base / f"Ebay_{part}.txt").write_text("\n".join(lines) + "\n")
    return base


INSHOP_TRAIN = ["id_00000001", "id_00000002", "id_00000004", "id_00000007", "id_00000009"]
INSHOP_TEST = ["id_00000003", "id_00000005", "id_00000006", "id_00000008"]


def inshop(root: Path) -> Path:
    rows = []
    for i, item in enumerate(INSHOP_TRAIN + INSHOP_TEST):
        category = "WOMEN/Dresses" if i % 2 else "MEN/Denim"
        for k in range(PER_CLASS):
            rel = f"img/{category}/{item}/0{k + 1}_1_front.jpg"
            # each photo its own: a query must not be a pixel copy of a gallery image (evaluate
            # counts such copies, and identical inputs embed identically on any processor)
            left, top = 1 + 2 * k, 1 + i % 4
            image(root / "Img" / rel, box=(left, top, left + 8, top + 6))
            status = "train" if item in INSHOP_TRAIN else ("query" if k == 0 else "gallery")
            rows.append(f"{rel}     {item}     {status}")
    (root / "Eval").mkdir(parents=True, exist_ok=True)
    text = f"{len(rows)}\nimage_name item_id evaluation_status\n" + "\n".join(rows) + "\n"
    (root / "Eval" / "list_eval_partition.txt").write_text(text)
    return root


VEHICLE_TRAIN = [2, 5, 7, 11, 13]
VEHICLE_TEST = {800: [3, 4, 6, 8], 1600: [3, 4, 6, 8, 9, 10], 2400: [3, 4, 6, 8, 9, 10, 12, 14]}


def vehicleid(root: Path) -> Path:
    base = root / "VehicleID_V1.0"
    (base / "train_test_split").mkdir(parents=True, exist_ok=True)
    lists = {"train_list.txt": VEHICLE_TRAIN} | {
        f"test_list_{n}.txt": v for n, v in VEHICLE_TEST.items()
    }
    for name, vehicles in lists.items():
        lines = []
        for v in vehicles:
            for k in range(PER_CLASS):
                img = f"{v:04d}{k:03d}"
                image(base / "image" / f"{img}.jpg")
                lines.append(f"{img} {v:06d}")
        (base / "train_test_split" / name).write_text("\n".join(lines) + "\n")
    return base


BUILDERS = {"cub200": cub200, "cars196": cars196, "sop": sop, "inshop": inshop,
            "vehicleid": vehicleid}  # fmt: skip


def truncate(path: Path) -> None:
    """Cut an image file short, as an interrupted copy would."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
