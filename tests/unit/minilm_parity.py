"""The texts on which the default all-MiniLM-L6-v2 must agree with sentence-transformers, and the
checked-in reference vectors sentence-transformers gave for them.

Regenerate the reference (needs the ``local-model`` extra: torch and sentence-transformers) with
``.venv/bin/python -m tests.unit.minilm_parity``; the test then runs against it without torch.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

REFERENCE_DIR = Path(__file__).parent / "data" / "minilm_parity"
TEXTS_FILE = REFERENCE_DIR / "texts.json"
VECTORS_FILE = REFERENCE_DIR / "vectors.npy"

_HANDWRITTEN = [
    "",
    " ",
    "\n\t ",
    "!!! ???",
    "a",
    "OK",
    "The deploy failed because the quota was exceeded",
    "deployment quota error",
    "Alice likes hiking",
    "Alice prefers store credit to card refunds.",
    "refund declined",
    "What did the user say about the nightly backup?",
    "kubectl apply -f deploy.yaml returned 'error: the server doesn't have a resource type \"deploy\"'",
    "SELECT id, text FROM memory_entries WHERE org_id = $1 ORDER BY created_at DESC LIMIT 10;",
    "def f(x):\n    return x ** 2  # square it",
    "https://example.com/path?query=1&other=two#fragment",
    "user@example.com called +1 (555) 010-9999 about invoice INV-2026-0042",
    "3.14159 2.71828 1.41421 1 2 3 4 5 6 7 8 9 10",
    "ALL CAPS SHOUTING ABOUT THE OUTAGE",
    "MiXeD cAsE tExT wItH sTrAnGe CaPiTaLs",
    "Ünïcödé wörds, 数字 and emoji 🚀 are text too",
    "🚀🔥💯",
    "🙂",
    "The build is green ✅ but the deploy is red ❌",
    "I ❤️ this café's crème brûlée",
    "Das Deployment ist fehlgeschlagen, weil das Kontingent überschritten wurde.",
    "Le déploiement a échoué parce que le quota était dépassé.",
    "El despliegue falló porque se superó la cuota.",
    "O deploy falhou porque a cota foi excedida.",
    "Il rilascio è fallito perché la quota è stata superata.",
    "De uitrol is mislukt omdat het quotum is overschreden.",
    "Развертывание не удалось, потому что квота была превышена.",
    "部署失败，因为超出了配额。",
    "デプロイはクォータを超えたため失敗しました。",
    "할당량이 초과되어 배포에 실패했습니다.",
    "فشل النشر بسبب تجاوز الحصة.",
    "परिनियोजन विफल रहा क्योंकि कोटा पार हो गया था।",
    "Η ανάπτυξη απέτυχε επειδή ξεπεράστηκε το όριο.",
    "Wdrożenie nie powiodło się, ponieważ przekroczono limit.",
    "Dağıtım kota aşıldığı için başarısız oldu.",
    "การปรับใช้ล้มเหลวเนื่องจากเกินโควต้า",
    "Việc triển khai thất bại vì vượt quá hạn mức.",
    "הפריסה נכשלה כי המכסה נוצלה.",
    "zero\u200bwidth\u200bspaces and\u00a0non-breaking\u00a0ones",
    "tab\tseparated\tvalues\nand new lines\r\nof every kind",
    "control \x07 characters \x1b[31m in text",
    "a" * 300,
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "The car would not start",
    "My automobile failed to ignite",
    "Bake at 200 C",
]

_SUBJECTS = [
    "the deploy",
    "the nightly backup",
    "kubectl apply",
    "the payment API",
    "certbot",
    "the CI job",
    "Alice",
    "the support agent",
    "the refund workflow",
    "the database migration",
]
_VERBS = ["failed", "timed out", "was retried", "succeeded", "was rate limited", "returned 503", "hung"]
_CAUSES = [
    "because the quota was exceeded",
    "after the DNS change propagated",
    "when the token expired",
    "because the disk on node {n} was full",
    "until the user asked to pin the version",
    "since the region eu-west-{n} was degraded",
    "while the cache was cold",
]
_SENTENCES = [
    "The customer asked for a refund on order A-{n} and prefers store credit.",
    "Retry the payment with exponential backoff, starting at two seconds.",
    "The staging cluster runs three replicas behind an nginx ingress.",
    "Never run the migration during business hours in the Berlin office.",
    "Bob said the invoices are exported every Monday at 06:00 UTC.",
    "The model answered in French although the user wrote in English.",
    "Use the read replica for reports; the primary is for writes only.",
    "The on-call engineer silenced the alert for {n} minutes.",
]


def parity_texts() -> list[str]:
    """At least 200 varied texts: hand-picked edge cases, memory-like sentences of every length,
    and long texts past the model's 256 word pieces (sentence-transformers truncates them)."""
    rng = random.Random(11)
    texts = list(_HANDWRITTEN)
    for n in range(90):
        cause = rng.choice(_CAUSES).format(n=n)
        texts.append(f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {cause}")
    for n in range(40):
        count = rng.randint(2, 12)
        texts.append(" ".join(rng.choice(_SENTENCES).format(n=n + i) for i in range(count)))
    for n in range(20):  # 300 to 1200 words: every one truncated
        count = rng.randint(30, 120)
        texts.append(" ".join(rng.choice(_SENTENCES).format(n=n * 7 + i) for i in range(count)))
    for n in range(10):
        texts.append(" ".join(rng.choice(_HANDWRITTEN[25:43]) for _ in range(rng.randint(2, 40 + n))))
    return texts


def load_reference() -> tuple[list[str], np.ndarray]:
    """The checked-in texts and sentence-transformers' float32 vectors for them."""
    texts = json.loads(TEXTS_FILE.read_text(encoding="utf-8"))["texts"]
    vectors = np.load(VECTORS_FILE)
    return texts, vectors


def _write_reference() -> None:
    import sentence_transformers
    import torch

    from shared.adapters.embedders.minilm_torch import SentenceTransformerEmbedder

    texts = parity_texts()
    vectors = np.asarray(SentenceTransformerEmbedder().embed_sync(texts), dtype=np.float32)
    REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
    meta = {
        "made_by": "python -m tests.unit.minilm_parity",
        "sentence_transformers": sentence_transformers.__version__,
        "torch": torch.__version__,
        "texts": texts,
    }
    TEXTS_FILE.write_text(json.dumps(meta, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    np.save(VECTORS_FILE, vectors)
    print(f"{len(texts)} texts → {TEXTS_FILE}, {VECTORS_FILE} {vectors.shape}")


if __name__ == "__main__":
    _write_reference()
