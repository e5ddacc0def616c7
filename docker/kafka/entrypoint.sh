#!/bin/bash
# The broker's configuration from KAFKA_* variables (as the apache/kafka image reads them: the
# name after KAFKA_, lower case, `_` for `.`, `__` for `_`, `___` for `-`), the storage
# formatted with CLUSTER_ID on first start, then the broker in the foreground.
set -euo pipefail
DATA=/var/lib/kafka
PROPS=$DATA/server.properties
: "${CLUSTER_ID:?CLUSTER_ID is required: 16 bytes in URL-safe base64, as kafka-storage random-uuid prints}"

{
    echo "log.dirs=$DATA/data"
    env | sort | while IFS='=' read -r name value; do
        case $name in
        KAFKA_HEAP_OPTS | KAFKA_OPTS) continue ;;
        KAFKA_*) ;;
        *) continue ;;
        esac
        prop=${name#KAFKA_}
        prop=${prop,,}
        prop=${prop//___/-}
        prop=${prop//__/@}
        prop=${prop//_/.}
        prop=${prop//@/_}
        echo "$prop=$value"
    done
} >"$PROPS"

cat >"$DATA/log4j2.properties" <<EOC
status = warn
appender.stdout.type = Console
appender.stdout.name = stdout
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = stdout
logger.request.name = kafka.request.logger
logger.request.level = warn
EOC
cat >"$DATA/log4j.properties" <<EOC
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.org.apache.kafka.clients=WARN
EOC

JAVA_LOGS=(-Dlog4j.configuration="file:$DATA/log4j.properties" -Dlog4j2.configurationFile="$DATA/log4j2.properties")
if [[ ! -f $DATA/.formatted ]]; then
    java -Xmx256m "${JAVA_LOGS[@]}" -cp '/opt/kafka/libs/*' kafka.tools.StorageTool format \
        --cluster-id "$CLUSTER_ID" --config "$PROPS" --ignore-formatted
    touch "$DATA/.formatted"
fi
# shellcheck disable=SC2086  # KAFKA_HEAP_OPTS and KAFKA_OPTS hold several JVM flags on purpose
exec java ${KAFKA_HEAP_OPTS:--Xmx512m} ${KAFKA_OPTS:-} -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true "${JAVA_LOGS[@]}" \
    -cp '/opt/kafka/libs/*' kafka.Kafka "$PROPS"
