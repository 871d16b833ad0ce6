"""Class names for a model that carries none, and the names file a user gives to override them.

An official checkpoint has no class names, only a class count. 80 classes are taken to be COCO's
and 366 Objects365's (in the label order of the official models); every place that shows names says
so with `note` (sidecar, bench, serve). `--names FILE` on any CLI that reads a model overrides both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from dfine_deploy.errors import ConfigError

# The 80 COCO detection classes in label order: the values of `mscoco_category2name` in the official
# D-FINE source (src/data/dataset/coco_dataset.py, github.com/Peterande/D-FINE at commit 4a1f73a).
COCO_NAMES: tuple[str, ...] = (
    "person",
    "bicycle",
    "car",
    "motorcycle",
    "airplane",
    "bus",
    "train",
    "truck",
    "boat",
    "traffic light",
    "fire hydrant",
    "stop sign",
    "parking meter",
    "bench",
    "bird",
    "cat",
    "dog",
    "horse",
    "sheep",
    "cow",
    "elephant",
    "bear",
    "zebra",
    "giraffe",
    "backpack",
    "umbrella",
    "handbag",
    "tie",
    "suitcase",
    "frisbee",
    "skis",
    "snowboard",
    "sports ball",
    "kite",
    "baseball bat",
    "baseball glove",
    "skateboard",
    "surfboard",
    "tennis racket",
    "bottle",
    "wine glass",
    "cup",
    "fork",
    "knife",
    "spoon",
    "bowl",
    "banana",
    "apple",
    "sandwich",
    "orange",
    "broccoli",
    "carrot",
    "hot dog",
    "pizza",
    "donut",
    "cake",
    "chair",
    "couch",
    "potted plant",
    "bed",
    "dining table",
    "toilet",
    "tv",
    "laptop",
    "mouse",
    "remote",
    "keyboard",
    "cell phone",
    "microwave",
    "oven",
    "toaster",
    "sink",
    "refrigerator",
    "book",
    "clock",
    "vase",
    "scissors",
    "teddy bear",
    "hair drier",
    "toothbrush",
)

# Objects365 (v2) classes in the label order of the official D-FINE *_obj365 models: the (index, name)
# table in src/solver/_solver.py of github.com/Peterande/D-FINE at commit 4a1f73a (its `obj365_ids`
# maps COCO labels into this order, e.g. person 0, bicycle 46, car 5). The models have 366 outputs;
# the last one has no class in that table.
OBJECTS365_NAMES: tuple[str, ...] = (
    'Person', 'Sneakers', 'Chair', 'Other Shoes', 'Hat', 'Car', 'Lamp', 'Glasses', 'Bottle', 'Desk', 'Cup',
    'Street Lights', 'Cabinet/shelf', 'Handbag/Satchel', 'Bracelet', 'Plate', 'Picture/Frame', 'Helmet',
    'Book', 'Gloves', 'Storage box', 'Boat', 'Leather Shoes', 'Flower', 'Bench', 'Potted Plant',
    'Bowl/Basin', 'Flag', 'Pillow', 'Boots', 'Vase', 'Microphone', 'Necklace', 'Ring', 'SUV', 'Wine Glass',
    'Belt', 'Monitor/TV', 'Backpack', 'Umbrella', 'Traffic Light', 'Speaker', 'Watch', 'Tie',
    'Trash bin Can', 'Slippers', 'Bicycle', 'Stool', 'Barrel/bucket', 'Van', 'Couch', 'Sandals', 'Basket',
    'Drum', 'Pen/Pencil', 'Bus', 'Wild Bird', 'High Heels', 'Motorcycle', 'Guitar', 'Carpet', 'Cell Phone',
    'Bread', 'Camera', 'Canned', 'Truck', 'Traffic cone', 'Cymbal', 'Lifesaver', 'Towel', 'Stuffed Toy',
    'Candle', 'Sailboat', 'Laptop', 'Awning', 'Bed', 'Faucet', 'Tent', 'Horse', 'Mirror', 'Power outlet',
    'Sink', 'Apple', 'Air Conditioner', 'Knife', 'Hockey Stick', 'Paddle', 'Pickup Truck', 'Fork',
    'Traffic Sign', 'Balloon', 'Tripod', 'Dog', 'Spoon', 'Clock', 'Pot', 'Cow', 'Cake', 'Dining Table',
    'Sheep', 'Hanger', 'Blackboard/Whiteboard', 'Napkin', 'Other Fish', 'Orange/Tangerine', 'Toiletry',
    'Keyboard', 'Tomato', 'Lantern', 'Machinery Vehicle', 'Fan', 'Green Vegetables', 'Banana',
    'Baseball Glove', 'Airplane', 'Mouse', 'Train', 'Pumpkin', 'Soccer', 'Skiboard', 'Luggage',
    'Nightstand', 'Tea pot', 'Telephone', 'Trolley', 'Head Phone', 'Sports Car', 'Stop Sign', 'Dessert',
    'Scooter', 'Stroller', 'Crane', 'Remote', 'Refrigerator', 'Oven', 'Lemon', 'Duck', 'Baseball Bat',
    'Surveillance Camera', 'Cat', 'Jug', 'Broccoli', 'Piano', 'Pizza', 'Elephant', 'Skateboard',
    'Surfboard', 'Gun', 'Skating and Skiing Shoes', 'Gas Stove', 'Donut', 'Bow Tie', 'Carrot', 'Toilet',
    'Kite', 'Strawberry', 'Other Balls', 'Shovel', 'Pepper', 'Computer Box', 'Toilet Paper',
    'Cleaning Products', 'Chopsticks', 'Microwave', 'Pigeon', 'Baseball', 'Cutting/chopping Board',
    'Coffee Table', 'Side Table', 'Scissors', 'Marker', 'Pie', 'Ladder', 'Snowboard', 'Cookies', 'Radiator',
    'Fire Hydrant', 'Basketball', 'Zebra', 'Grape', 'Giraffe', 'Potato', 'Sausage', 'Tricycle', 'Violin',
    'Egg', 'Fire Extinguisher', 'Candy', 'Fire Truck', 'Billiards', 'Converter', 'Bathtub', 'Wheelchair',
    'Golf Club', 'Briefcase', 'Cucumber', 'Cigar/Cigarette', 'Paint Brush', 'Pear', 'Heavy Truck',
    'Hamburger', 'Extractor', 'Extension Cord', 'Tong', 'Tennis Racket', 'Folder', 'American Football',
    'Earphone', 'Mask', 'Kettle', 'Tennis', 'Ship', 'Swing', 'Coffee Machine', 'Slide', 'Carriage', 'Onion',
    'Green Beans', 'Projector', 'Frisbee', 'Washing Machine/Drying Machine', 'Chicken', 'Printer',
    'Watermelon', 'Saxophone', 'Tissue', 'Toothbrush', 'Ice Cream', 'Hot Air Balloon', 'Cello',
    'French Fries', 'Scale', 'Trophy', 'Cabbage', 'Hot Dog', 'Blender', 'Peach', 'Rice', 'Wallet/Purse',
    'Volleyball', 'Deer', 'Goose', 'Tape', 'Tablet', 'Cosmetics', 'Trumpet', 'Pineapple', 'Golf Ball',
    'Ambulance', 'Parking Meter', 'Mango', 'Key', 'Hurdle', 'Fishing Rod', 'Medal', 'Flute', 'Brush',
    'Penguin', 'Megaphone', 'Corn', 'Lettuce', 'Garlic', 'Swan', 'Helicopter', 'Green Onion', 'Sandwich',
    'Nuts', 'Speed Limit Sign', 'Induction Cooker', 'Broom', 'Trombone', 'Plum', 'Rickshaw', 'Goldfish',
    'Kiwi Fruit', 'Router/Modem', 'Poker Card', 'Toaster', 'Shrimp', 'Sushi', 'Cheese', 'Notepaper',
    'Cherry', 'Pliers', 'CD', 'Pasta', 'Hammer', 'Cue', 'Avocado', 'Hami Melon', 'Flask', 'Mushroom',
    'Screwdriver', 'Soap', 'Recorder', 'Bear', 'Eggplant', 'Board Eraser', 'Coconut', 'Tape Measure/Ruler',
    'Pig', 'Showerhead', 'Globe', 'Chips', 'Steak', 'Crosswalk Sign', 'Stapler', 'Camel', 'Formula 1',
    'Pomegranate', 'Dishwasher', 'Crab', 'Hoverboard', 'Meatball', 'Rice Cooker', 'Tuba', 'Calculator',
    'Papaya', 'Antelope', 'Parrot', 'Seal', 'Butterfly', 'Dumbbell', 'Donkey', 'Lion', 'Urinal', 'Dolphin',
    'Electric Drill', 'Hair Dryer', 'Egg Tart', 'Jellyfish', 'Treadmill', 'Lighter', 'Grapefruit',
    'Game Board', 'Mop', 'Radish', 'Baozi', 'Target', 'French', 'Spring Rolls', 'Monkey', 'Rabbit',
    'Pencil Case', 'Yak', 'Red Cabbage', 'Binoculars', 'Asparagus', 'Barbell', 'Scallop', 'Noodles', 'Comb',
    'Dumpling', 'Oyster', 'Table Tennis Paddle', 'Cosmetics Brush/Eyeliner Pencil', 'Chainsaw', 'Eraser',
    'Lobster', 'Durian', 'Okra', 'Lipstick', 'Cosmetics Mirror', 'Curling', 'Table Tennis',
)
OBJECTS365_CLASSES = 366


class ClassNames(NamedTuple):
    names: list[str]
    note: str  # "" when the names came with the model or from the user


def default_class_names(num_classes: int) -> ClassNames:
    """Names assumed from the class count alone: COCO for 80, Objects365 for 366, else `class_<i>`."""
    if num_classes == len(COCO_NAMES):
        return ClassNames(list(COCO_NAMES), "names assumed from the class count: 80 = COCO")
    if num_classes == OBJECTS365_CLASSES:
        names = list(OBJECTS365_NAMES) + [f"class_{i}" for i in range(len(OBJECTS365_NAMES), num_classes)]
        return ClassNames(names, "names assumed from the class count: 366 = Objects365")
    return ClassNames([f"class_{i}" for i in range(num_classes)],
                      "the model names no classes: class_<index>")


def read_names_file(path: str | Path, num_classes: int | None = None) -> list[str]:
    """Class names from a file: one per line (.txt), a JSON list, or YAML (a list, or a `names:` list
    or {index: name} mapping as in a YOLO data.yaml). Its length must equal the model's class count."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--names {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None
    if path.suffix.lower() in (".json", ".yaml", ".yml"):
        try:
            if path.suffix.lower() == ".json":
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except ValueError as exc:
            raise ConfigError(f"--names {path}: not valid {path.suffix[1:].upper()} ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - yaml's errors share no base with ValueError
            raise ConfigError(f"--names {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if isinstance(data, dict) and "names" in data:
            data = data["names"]
        if isinstance(data, dict):
            keys = sorted(data, key=lambda k: int(k)) if all(str(k).isdigit() for k in data) else None
            if keys is None or [int(k) for k in keys] != list(range(len(keys))):
                raise ConfigError(f"--names {path}: a mapping must have the keys 0..N-1")
            data = [data[k] for k in keys]
        if not isinstance(data, list) or not all(isinstance(n, (str, int, float)) for n in data):
            raise ConfigError(f"--names {path}: expected a list of names (or `names:`), found {type(data).__name__}")
        names = [str(n).strip() for n in data]
    else:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names or any(not n for n in names):
        raise ConfigError(f"--names {path}: has an empty name; give one non-empty name per class")
    if num_classes is not None and len(names) != num_classes:
        raise ConfigError(
            f"--names {path}: has {len(names)} names but the model has {num_classes} classes; "
            "give exactly one name per class, in label order"
        )
    return names
