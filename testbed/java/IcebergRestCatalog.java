// Apache Iceberg's REST catalog server (org.apache.iceberg.rest.RESTCatalogServer, from the
// iceberg-open-api test fixtures), listening on 127.0.0.1 only.
//
// RESTCatalogServer.start() binds its Jetty connector to every interface and has no host
// setting. This runs the same parts it runs -- its backend catalog from the CATALOG_*
// environment (RCKUtils' naming: CATALOG_WAREHOUSE -> warehouse, CATALOG_IO__IMPL -> io-impl)
// and its RESTServerCatalogAdapter -- behind a connector bound to loopback. Run in Java's
// source-file mode: java -cp '<jars>/*' IcebergRestCatalog.java <port>
import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServer;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.handler.gzip.GzipHandler;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public class IcebergRestCatalog {
  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      throw new IllegalArgumentException("usage: IcebergRestCatalog <port>");
    }
    int port = Integer.parseInt(args[0]);

    // The server's own catalog set-up and adapter are package-private.
    Constructor<RESTCatalogServer> serverConstructor = RESTCatalogServer.class.getDeclaredConstructor();
    serverConstructor.setAccessible(true);
    Method initialize = RESTCatalogServer.class.getDeclaredMethod("initializeBackendCatalog");
    initialize.setAccessible(true);
    Object catalogContext = initialize.invoke(serverConstructor.newInstance());
    Class<?> adapterClass = Class.forName("org.apache.iceberg.rest.RESTServerCatalogAdapter");
    Constructor<?> adapterConstructor = adapterClass.getDeclaredConstructor(catalogContext.getClass());
    adapterConstructor.setAccessible(true);
    RESTCatalogAdapter adapter = (RESTCatalogAdapter) adapterConstructor.newInstance(catalogContext);

    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(adapter)), "/*");
    context.insertHandler(new GzipHandler());
    Server http = new Server();
    ServerConnector connector = new ServerConnector(http);
    connector.setHost("127.0.0.1");
    connector.setPort(port);
    http.addConnector(connector);
    http.setHandler(context);
    http.start();
    System.out.println("Iceberg REST catalog listening on 127.0.0.1:" + port);
    http.join();
  }
}
