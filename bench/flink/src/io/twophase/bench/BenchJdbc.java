package io.twophase.bench;

import java.sql.PreparedStatement;
import java.sql.SQLException;

import javax.sql.XADataSource;

import org.apache.flink.connector.jdbc.JdbcStatementBuilder;
import org.apache.flink.types.Row;
import org.apache.flink.util.function.SerializableSupplier;
import org.postgresql.xa.PGXADataSource;

/**
 * The two Java pieces the JDBC XA sink of bench/flink_jobs.py needs and Python cannot provide:
 * flink-connector-jdbc 3.3.0 has no Row statement builder reachable from Python (PyFlink 1.20's
 * JdbcSink.sink looks for one that 3.3.0 removed), and its XA sink needs a serializable
 * XADataSource supplier (SimpleXaConnectionProvider.from wraps a non-serializable lambda).
 * `make bench` compiles this file once into the cache.
 */
public final class BenchJdbc {
    private BenchJdbc() {}

    /** Binds a Row's fields to the statement's parameters in order. */
    public static class RowStatementBuilder implements JdbcStatementBuilder<Row> {
        private static final long serialVersionUID = 1L;

        @Override
        public void accept(PreparedStatement statement, Row row) throws SQLException {
            for (int i = 0; i < row.getArity(); i++) {
                statement.setObject(i + 1, row.getField(i));
            }
        }
    }

    /** A PostgreSQL XADataSource made on the task managers from a URL and credentials. */
    public static class PgXaSupplier implements SerializableSupplier<XADataSource> {
        private static final long serialVersionUID = 1L;
        private final String url;
        private final String user;
        private final String password;

        public PgXaSupplier(String url, String user, String password) {
            this.url = url;
            this.user = user;
            this.password = password;
        }

        @Override
        public XADataSource get() {
            PGXADataSource source = new PGXADataSource();
            source.setUrl(url);
            source.setUser(user);
            if (password != null && !password.isEmpty()) {
                source.setPassword(password);
            }
            return source;
        }
    }
}
