// Writes a PKCS12 trust store holding every certificate of a PEM bundle, for the JVM of a build
// step (Maven, Ivy) that must trust what the machine trusts: the build's CA bundle is PEM, and the
// JDK reads trust stores only.
//
//   java PemTrustStore.java BUNDLE.pem OUT.p12 PASSWORD

import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;

public class PemTrustStore {
    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: java PemTrustStore.java BUNDLE.pem OUT.p12 PASSWORD");
            System.exit(2);
        }
        KeyStore store = KeyStore.getInstance("PKCS12");
        store.load(null, null);
        int count = 0;
        try (InputStream in = new FileInputStream(args[0])) {
            for (Certificate cert : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                store.setCertificateEntry("ca-" + count++, cert);
            }
        }
        if (count == 0) {
            System.err.println("no certificate in " + args[0]);
            System.exit(1);
        }
        try (OutputStream out = new FileOutputStream(args[1])) {
            store.store(out, args[2].toCharArray());
        }
        System.err.println(count + " certificates trusted");
    }
}
