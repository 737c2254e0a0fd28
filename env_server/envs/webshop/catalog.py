"""The WebShop product catalog: load the scraped product files and normalize each product as the
original engine does (docs/DESIGN.md#webshop-catalog), or generate a small synthetic catalog in the same
raw format when no data is installed, so that every later step runs the same code either way.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

DATA_ENV = "WEBSHOP_DATA"
PRODUCTS_FILE = "items_shuffle_1000.json"
ATTRIBUTES_FILE = "items_ins_v2_1000.json"
HUMAN_INSTRUCTIONS_FILE = "items_human_ins.json"
PRICE_SEED = 233            # one fixed seed for the per-product price draw (see sample_prices)
DEFAULT_PRICE = 100.0       # what the original assigns to a product with no pricing
NO_ATTRIBUTES = ("DUMMY_ATTR",)
SYNTHETIC = "synthetic"       # a data_dir value that asks for the generated catalog


@dataclass(frozen=True, eq=False)
class Product:
    """One normalized product. Field meanings follow the original engine's derived keys."""

    asin: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    pricing: tuple[float, ...]          # one price, or the two ends of a range
    price_tag: str                      # shown on pages: "$877.8", "$19.99 to $27.99"
    options: dict[str, tuple[str, ...]]  # option name -> values, in the file's order
    option_images: dict[str, str | None]
    main_image: str
    category: str
    query: str
    product_category: str
    attributes: tuple[str, ...]
    instruction: str | None = None      # synthetic-goal seed text (items_ins), if any
    instruction_attributes: tuple[str, ...] = ()
    human_instructions: tuple[dict, ...] = field(default=())
    rating: str = "N.A."                # the original never loads ratings


@dataclass(frozen=True, eq=False)
class Catalog:
    products: tuple[Product, ...]
    by_asin: dict[str, Product]
    prices: dict[str, float]            # the sampled price per product, used by goals and reward
    source: str                         # a data directory, or "synthetic:<n>:<seed>"
    digest: str                         # sha256 over the source files or generator parameters


# ---- pure normalization ------------------------------------------------------------------------
def parse_pricing(pricing: str) -> tuple[tuple[float, ...], str]:
    """'$877.80' -> ((877.8,), '$877.8'); '$1$2$3' -> ((1.0, 2.0), '$1.0 to $2.0'); '' -> default.

    The tag is built with Python float formatting on purpose: the original shows "$877.8".
    """
    pieces = [re.sub(r"[^\d.]", "", piece) for piece in pricing.split("$")[1:]] if pricing else []
    values = tuple(float(Decimal(piece)) for piece in pieces if piece)
    if not values:
        return (DEFAULT_PRICE,), f"${DEFAULT_PRICE}"
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def normalize_option_value(value: str) -> str:
    return value.strip().replace("/", " | ").lower()


def normalize_options(raw_options: dict | str | None) -> tuple[dict[str, tuple[str, ...]], dict[str, str | None]]:
    """Option names and values lowercased, '/' shown as ' | '; a null value list is skipped."""
    options: dict[str, tuple[str, ...]] = {}
    images: dict[str, str | None] = {}
    for name, contents in (raw_options or {}).items():
        if contents is None:
            continue
        values = []
        for content in contents:
            value = normalize_option_value(content["value"])
            values.append(value)
            images[value] = content.get("image")
        options[name.lower()] = tuple(values)
    return options, images


def normalize_product(raw: dict, attribute_entry: dict | None, human_entries: list[dict] | None) -> Product:
    """Map one raw scraped record (plus its items_ins entry) to a Product."""
    description = raw.get("small_description")
    bullets = tuple(description) if isinstance(description, list) else (description,)
    pricing, price_tag = parse_pricing(raw.get("pricing") or "")
    options, option_images = normalize_options(raw.get("customization_options"))
    attribute_entry = attribute_entry or {}
    images = raw.get("images") or [""]
    return Product(
        asin=raw["asin"],
        title=raw["name"],
        description=raw["full_description"],
        bullet_points=bullets,
        pricing=pricing,
        price_tag=price_tag,
        options=options,
        option_images=option_images,
        main_image=images[0],
        category=raw["category"],
        query=raw["query"].lower().strip(),
        product_category=raw["product_category"],
        attributes=tuple(attribute_entry.get("attributes") or NO_ATTRIBUTES),
        instruction=attribute_entry.get("instruction"),
        instruction_attributes=tuple(attribute_entry.get("instruction_attributes") or ()),
        human_instructions=tuple(human_entries or ()),
    )


def is_valid_asin(asin: str) -> bool:
    return asin != "nan" and len(asin) <= 10


def sample_prices(products: tuple[Product, ...], rng: random.Random) -> dict[str, float]:
    """A range-priced product gets one uniform draw inside its range, drawn in catalog order."""
    return {
        p.asin: rng.uniform(*p.pricing) if len(p.pricing) == 2 else p.pricing[0]
        for p in products
    }


def build_catalog(
    raw_products: list[dict],
    attributes: dict[str, dict],
    human_instructions: dict[str, list[dict]] | None,
    num_products: int | None,
    source: str,
    digest: str,
) -> Catalog:
    """Normalize records in file order: first N records, invalid and duplicate asins skipped."""
    if num_products is not None:
        raw_products = raw_products[:num_products]
    products: list[Product] = []
    seen: set[str] = set()
    for raw in raw_products:
        asin = raw["asin"]
        if not is_valid_asin(asin) or asin in seen:
            continue
        seen.add(asin)
        human = (human_instructions or {}).get(asin)
        products.append(normalize_product(raw, attributes.get(asin), human))
    products_tuple = tuple(products)
    return Catalog(
        products=products_tuple,
        by_asin={p.asin: p for p in products_tuple},
        prices=sample_prices(products_tuple, random.Random(PRICE_SEED)),
        source=source,
        digest=digest,
    )


# ---- files -------------------------------------------------------------------------------------
def resolve_data_dir(data_dir: str | None) -> Path | None:
    """The explicit directory, else $WEBSHOP_DATA; None (the synthetic catalog) when neither is set
    or when either says "synthetic"."""
    chosen = data_dir or os.environ.get(DATA_ENV) or SYNTHETIC
    if chosen == SYNTHETIC:
        return None
    path = Path(chosen)
    missing = [name for name in (PRODUCTS_FILE, ATTRIBUTES_FILE) if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"WebShop data dir {path} lacks {missing} (set {DATA_ENV} to a dir that has them)")
    return path


def file_digest(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def load_catalog(data_dir: Path, num_products: int | None, human_goals: bool) -> Catalog:
    files = [data_dir / PRODUCTS_FILE, data_dir / ATTRIBUTES_FILE]
    human = None
    if human_goals:
        human_path = data_dir / HUMAN_INSTRUCTIONS_FILE
        if not human_path.is_file():
            raise FileNotFoundError(f"human goals need {human_path}; it is not part of the small data set")
        files.append(human_path)
        human = json.loads(human_path.read_text())
    raw_products = json.loads(files[0].read_text())
    attributes = json.loads(files[1].read_text())
    return build_catalog(raw_products, attributes, human, num_products, str(data_dir), file_digest(files))


# ---- synthetic catalog -------------------------------------------------------------------------
_CATEGORIES = {
    "beauty": (["shampoo", "conditioner", "face serum", "lip balm", "hair dryer", "nail polish"],
               ["paraben free", "long lasting", "natural ingredients", "sensitive skin", "travel size"]),
    "electronics": (["headphones", "charger", "hdmi cable", "bluetooth speaker", "webcam", "power bank"],
                    ["fast charging", "noise cancelling", "high definition", "wireless bluetooth", "usb c"]),
    "garden": (["console table", "bar stool", "throw pillow", "wall lamp", "storage bench", "area rug"],
               ["easy assemble", "solid wood", "living room", "non slip", "space saving"]),
    "fashion": (["running shoes", "t-shirt", "rain jacket", "yoga pants", "wool socks", "baseball cap"],
                ["machine wash", "long sleeve", "relaxed fit", "quick drying", "button closure"]),
    "grocery": (["green tea", "dark chocolate", "trail mix", "olive oil", "coffee beans", "honey"],
                ["gluten free", "sugar free", "non gmo", "low calorie", "keto friendly"]),
}
_BRANDS = ["Acme", "Nordlys", "Vireo", "Kestrel", "Lumen", "Orchard", "Tidewater", "Quill"]
_COLORS = ["black", "navy blue", "white", "red", "forest green", "light gray", "rose gold"]
_SIZES = ["small", "medium", "large", "x-large", "8 ounce (pack of 2)", "12 inch"]


def synthetic_records(num_products: int, seed: int) -> tuple[list[dict], dict[str, dict]]:
    """Raw product records and items_ins entries in the original file formats, fully determined
    by (num_products, seed). About 40% of products seed synthetic goals, as in the real world."""
    rng = random.Random(seed)
    records, attributes = [], {}
    for i in range(num_products):
        category = rng.choice(sorted(_CATEGORIES))
        nouns, attribute_pool = _CATEGORIES[category]
        noun = rng.choice(nouns)
        brand = rng.choice(_BRANDS)
        product_attributes = rng.sample(attribute_pool, rng.randint(1, 3))
        title = f"{brand} {' '.join(a.title() for a in product_attributes)} {noun.title()}"
        asin = f"S{i:09d}"
        bullets = [f"{a.capitalize()} design from {brand}." for a in product_attributes]
        options = {}
        if rng.random() < 0.5:
            options["Color"] = [{"value": c, "image": None} for c in rng.sample(_COLORS, rng.randint(2, 3))]
        if rng.random() < 0.4:
            options["Size"] = [{"value": s} for s in rng.sample(_SIZES, rng.randint(2, 3))]
        if rng.random() < 0.1:
            options["Style"] = None     # the scraped files have null option lists
        low = round(rng.uniform(2, 300), 2)
        pricing = rng.choice(["", f"${low:.2f}", f"${low:.2f}${low * 1.5:.2f}"])
        records.append({
            "name": title,
            "full_description": f"The {noun} by {brand}. " + " ".join(bullets),
            "small_description": bullets if rng.random() < 0.9 else bullets[0],
            "pricing": pricing,
            "images": [f"https://images.example/{asin}.jpg"],
            "product_category": f"{category.title()} › {noun.title()}s",
            "customization_options": options or "",
            "asin": asin,
            "category": category,
            "query": f"{noun}s",
        })
        entry = {"attributes": product_attributes}
        if rng.random() < 0.4:
            goal_attributes = product_attributes[: rng.randint(1, len(product_attributes))]
            entry["instruction"] = f"i need a {noun} that is {', and '.join(goal_attributes)}"
            entry["instruction_attributes"] = goal_attributes
        attributes[asin] = entry
    return records, attributes


def synthetic_catalog(num_products: int, seed: int) -> Catalog:
    records, attributes = synthetic_records(num_products, seed)
    digest = hashlib.sha256(f"synthetic:{num_products}:{seed}".encode()).hexdigest()
    return build_catalog(records, attributes, None, None, f"synthetic:{num_products}:{seed}", digest)
