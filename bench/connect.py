"""Kafka Connect 4.1.1 + Debezium, fetched from Maven Central into a cache dir.

Each part is one generated pom and one `mvn dependency:copy-dependencies`:
the worker's classpath, and one plugin.path directory per plugin (runtime
scope only, so the Kafka jars the plugins mark `provided` stay out).
"""

import os
import subprocess
import tarfile
from pathlib import Path

CONNECT_VERSION = "4.1.1"
DEBEZIUM_SOURCE_VERSION = "3.6.1.Final"
# debezium-connector-jdbc 3.6.1.Final is not on Maven Central (404 on
# 2026-11-30); 3.6.0.Final is the newest JDBC sink published there.
DEBEZIUM_JDBC_VERSION = "3.6.0.Final"
# The Avro converter: Apicurio Registry's 2.x converter
# (io.apicurio.registry.utils.converter.AvroConverter), which resolves from
# Maven Central with its dependencies and talks to the stack's Apicurio 3.3.3
# through the v2 REST API that 3.x still serves. Confluent's
# kafka-connect-avro-converter is not on Maven Central, and no Apicurio 3.x
# converter can be assembled from it (2026-11-30):
# apicurio-registry-utils-converter 3.3.3 has a pom but no jar; 3.1.x/3.2.x
# are absent; 3.0.9's jar is there but its parent pom
# (io.apicurio:apicurio-registry:3.0.9) is not, so it does not resolve, and
# next to the 3.1.7 serde it fails to load (ClassNotFoundException:
# io.apicurio.registry.serde.KafkaSerializer). The untuned Debezium row
# keeps Kafka's JsonConverter (schemas enabled), as measured first.
APICURIO_CONVERTER_VERSION = "2.6.13.Final"
# debezium-connector-mariadb's plugin archive is not on Maven Central for
# 3.6.1.Final or 3.6.0.Final (2026-12-04); 3.5.0.Final is the newest there.
# A plugin archive carries its own Debezium core, so it runs beside 3.6.1.
DEBEZIUM_MARIADB_VERSION = "3.5.0.Final"
LOG4J_VERSION = "2.24.3"

PARTS = {
    "worker": [
        ("org.apache.kafka", "connect-runtime", CONNECT_VERSION),
        ("org.apache.kafka", "connect-file", CONNECT_VERSION),
        ("org.apache.kafka", "connect-json", CONNECT_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ],
    # Debezium's own plugin archives (`-plugin.tar.gz` on Maven Central), as
    # Debezium ships them: resolving the JDBC sink's pom transitively fails
    # (it names org.hibernate:hibernate-agroal 7.2.6.Final, which Central
    # only has as org.hibernate.orm).
    "plugins/debezium-connector-postgres": [
        ("io.debezium", "debezium-connector-postgres", DEBEZIUM_SOURCE_VERSION, "tar.gz", "plugin"),
    ],
    # The MySQL source's row measures Debezium's MariaDB connector (its own
    # since Debezium 2.7; the MySQL connector no longer takes MariaDB's GTIDs).
    "plugins/debezium-connector-mariadb": [
        ("io.debezium", "debezium-connector-mariadb", DEBEZIUM_MARIADB_VERSION, "tar.gz", "plugin"),
    ],
    "plugins/debezium-connector-jdbc": [
        ("io.debezium", "debezium-connector-jdbc", DEBEZIUM_JDBC_VERSION, "tar.gz", "plugin"),
    ],
    "plugins/apicurio-converter": [
        ("io.apicurio", "apicurio-registry-utils-converter", APICURIO_CONVERTER_VERSION),
    ],
}


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "tributary-bench" / f"connect-{CONNECT_VERSION}-debezium-{DEBEZIUM_SOURCE_VERSION}"


def _pom(name, deps):
    lines = []
    for g, a, v, *archive in deps:
        extra = ""
        if archive:
            classifier = f"<classifier>{archive[1]}</classifier>" if archive[1] else ""
            extra = (f"<type>{archive[0]}</type>{classifier}"
                     "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>")
        lines.append(f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>{extra}</dependency>")
    d = "\n".join(lines)
    art = name.replace("/", "-")
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tributary.bench</groupId><artifactId>{art}</artifactId><version>1</version>
  <dependencies>
{d}
  </dependencies>
</project>
"""


def fetch(log=print):
    """Returns (worker lib dir, plugin.path dir); downloads what is missing."""
    root = cache_dir()
    for name, deps in PARTS.items():
        out = root / name
        done = out / ".complete"
        if done.exists():
            continue
        out.mkdir(parents=True, exist_ok=True)
        pom_dir = root / "poms" / name.replace("/", "-")
        pom_dir.mkdir(parents=True, exist_ok=True)
        (pom_dir / "pom.xml").write_text(_pom(name, deps))
        log(f"fetching {name} from Maven Central (mvn dependency:copy-dependencies)")
        cmd = ["mvn", "-B", "-q", "-f", str(pom_dir / "pom.xml"), "dependency:copy-dependencies",
               f"-DoutputDirectory={out}", "-DincludeScope=runtime"]
        if name.startswith("plugins/"):
            # The worker provides these; a second copy in a plugin breaks class loading.
            cmd.append("-DexcludeGroupIds=org.apache.kafka")
        with open(pom_dir / "mvn.log", "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise RuntimeError(f"mvn failed for {name}; see {pom_dir / 'mvn.log'}")
        for archive in out.glob("*.tar.gz"):
            with tarfile.open(archive) as t:
                t.extractall(out)
            archive.unlink()
        done.write_text("ok\n")
    return root / "worker", root / "plugins"



if __name__ == "__main__":
    print(fetch())
